"""Converting a model's weights to apex's ``cast_model_type`` (O0, O2, O3).

Both functions work in place on the module and keep every ``nn.Parameter`` and buffer
object (only their data changes), so optimizers and RoundPipe copies built afterwards see
the converted tensors.
"""

from __future__ import annotations

from typing import Any, Dict

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["convert_model_", "save_float16_as_float32"]


def convert_model_(model: nn.Module, dtype: torch.dtype, keep_batchnorm_fp32: bool) -> None:
    """Cast ``model``'s floating parameters and buffers to ``dtype``, in place.

    With ``keep_batchnorm_fp32`` every ``_BatchNorm`` module with ``affine=True`` keeps its
    parameters and running statistics as they are (apex's ``convert_network``; non-affine
    batchnorm is converted), gradients already present are converted with their
    parameters, and RNNs get ``flatten_parameters()``. Without it the whole model is
    ``model.to(dtype)``.
    """
    if not keep_batchnorm_fp32:
        model.to(dtype)
        return
    for module in model.modules():
        if isinstance(module, _BatchNorm) and module.affine:
            continue
        for param in module.parameters(recurse=False):
            if param.is_floating_point():
                param.data = param.data.to(dtype)
                if param.grad is not None:
                    param.grad.data = param.grad.data.to(dtype)
        for buffer in module.buffers(recurse=False):
            if buffer.is_floating_point():
                buffer.data = buffer.data.to(dtype)
        if isinstance(module, nn.RNNBase):
            module.flatten_parameters()


def save_float16_as_float32(model: nn.Module) -> None:
    """Make ``state_dict()`` of ``model`` and of each of its submodules return float16
    entries as float32 (apex's ``O2StateDictHook``), so checkpoints hold float32 weights."""
    for module in model.modules():
        module.register_state_dict_post_hook(_float16_entries_to_float32)


def _float16_entries_to_float32(
    module: nn.Module, state_dict: Dict[str, Any], prefix: str, local_metadata: Any
) -> None:
    for key, value in state_dict.items():
        is_float16 = isinstance(value, torch.Tensor) and value.dtype == torch.float16
        if is_float16 and key.startswith(prefix):
            state_dict[key] = value.float()
