"""Re-point an optimizer built on a module's own parameters at RoundPipe's optimizer copies.

Training code often builds its optimizer in a helper that groups the parameters by name
(decay / no-decay, layer-wise learning rates, ``named_parameters()`` filters). Those names
are the module's, not the RoundPipe wrapper's (``model.``-prefixed), so the helper is given
the wrapped module and the optimizer it returns is moved onto the copies here, parameter by
parameter, by identity: every group keeps its options and order, and state the optimizer
already holds for a parameter (``Adagrad`` creates some at construction; a loaded
``state_dict`` brings some) moves to its copy, cast to the copy's dtype.

:func:`move_onto_copies` is the move itself, shared with ``roundpipe.compat.initialize``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

import torch
from torch import nn

__all__ = ["adopt_optimizer", "move_onto_copies"]


def adopt_optimizer(
    optimizer: torch.optim.Optimizer,
    module: nn.Module,
    copy_of: Callable[[nn.Parameter], Optional[nn.Parameter]],
) -> torch.optim.Optimizer:
    """Replace, in ``optimizer``'s groups and state, each trainable parameter of ``module``
    by ``copy_of(parameter)`` (as :func:`move_onto_copies` does); return ``optimizer``.

    Parameters that already are copies stay (adopting twice changes nothing); a frozen
    parameter of ``module`` (no copy) stays too: it receives no gradient, so the optimizer
    skips it as it did before. Raises ``ValueError``, changing nothing, for a parameter that
    is not ``module``'s: it would be stepped on the optimizer thread while the main thread
    uses it.
    """
    own = {id(param) for param in module.parameters()}
    copies: Dict[nn.Parameter, nn.Parameter] = {}
    for param in module.parameters():
        copy = copy_of(param) if param.requires_grad else None
        if copy is not None:
            copies[param] = copy
    adopted = {id(copy) for copy in copies.values()}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) not in own and id(param) not in adopted:
                raise ValueError(
                    "RoundPipe.adopt_optimizer(): the optimizer holds a parameter that is not "
                    f"one of the wrapped module's (shape {tuple(param.shape)}); RoundPipe's "
                    "optimizer may only step the module's parameters"
                )
    move_onto_copies(optimizer, copies)
    return optimizer


def move_onto_copies(optimizer: torch.optim.Optimizer, copy_of: Mapping[nn.Parameter, nn.Parameter]) -> None:
    """Replace, in place, each parameter of ``optimizer``'s groups found in ``copy_of`` by
    its copy, keeping every group's options and order; parameters without one stay.

    State entries move to the copy, cast by torch's ``load_state_dict`` rule: ``"step"`` is
    kept, floating tensors take the copy's dtype and device, other tensors its device.
    """
    for group in optimizer.param_groups:
        group["params"] = [copy_of.get(param, param) for param in group["params"]]
    for original, copy in copy_of.items():
        if original in optimizer.state:
            optimizer.state[copy] = _moved_state(optimizer.state.pop(original), copy)


def _moved_state(state: Dict[str, Any], copy: torch.Tensor) -> Dict[str, Any]:
    moved = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor) and key != "step":
            dtype = copy.dtype if value.is_floating_point() else value.dtype
            value = value.to(device=copy.device, dtype=dtype)
        moved[key] = value
    return moved
