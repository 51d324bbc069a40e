"""Pointing the user's optimizers at RoundPipe's optimizer copies; apex's ``master_params``.

RoundPipe trains separate copies of the model's parameters (fp32 masters under O2). After
``initialize`` every optimizer passed to it is the *same object*, with its param groups
holding the copies instead of the model's parameters and its per-parameter state moved to
them. An optimizer may span several models.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator

import torch
from torch import nn

__all__ = ["check_not_initialized", "master_params", "rebind_to_copies"]

_MARK = "_roundpipe_compat_initialized"


def check_not_initialized(optimizer: torch.optim.Optimizer) -> None:
    """``RuntimeError`` if ``optimizer`` already went through :func:`rebind_to_copies`."""
    if getattr(optimizer, _MARK, False):
        raise RuntimeError(
            "A given optimizer should only be passed through roundpipe.compat.initialize "
            "once (it already holds RoundPipe's optimizer copies)."
        )


def rebind_to_copies(optimizer: torch.optim.Optimizer, copy_of: Dict[nn.Parameter, nn.Parameter]) -> None:
    """Replace, in place, each parameter of ``optimizer`` found in ``copy_of`` by its copy.

    Parameters without a copy (frozen ones, or ones of no wrapped model) stay as they are.
    State entries move to the copy, cast by torch's ``load_state_dict`` rule: ``"step"`` is
    kept, floating tensors take the copy's dtype and device, other tensors its device.
    The optimizer is marked, so a second ``initialize`` with it is refused.
    """
    for group in optimizer.param_groups:
        group["params"] = [copy_of.get(param, param) for param in group["params"]]
    for original, copy in copy_of.items():
        if original in optimizer.state:
            optimizer.state[copy] = _moved_state(optimizer.state.pop(original), copy)
    setattr(optimizer, _MARK, True)


def _moved_state(state: Dict[str, Any], copy: torch.Tensor) -> Dict[str, Any]:
    moved = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and key != "step":
            dtype = copy.dtype if value.is_floating_point() else value.dtype
            value = value.to(device=copy.device, dtype=dtype)
        moved[key] = value
    return moved


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every parameter of every param group of ``optimizer``, in order (apex's
    ``amp.master_params``). After ``initialize`` these are RoundPipe's optimizer copies:
    the fp32 masters under O2, the parameters the optimizer steps in every level."""
    for group in optimizer.param_groups:
        yield from group["params"]
