"""Re-point an optimizer built on a module's own parameters at RoundPipe's optimizer copies.

Training code often builds its optimizer in a helper that groups the parameters by name
(decay / no-decay, layer-wise learning rates, ``named_parameters()`` filters). Those names
are the module's, not the RoundPipe wrapper's (``model.``-prefixed), so the helper is given
the wrapped module and the optimizer it returns is moved onto the copies here, parameter by
parameter, by identity: every group keeps its options and order, and state the optimizer
already created for a parameter (``Adagrad`` does so at construction) moves to its copy.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional

import torch
from torch import nn

__all__ = ["adopt_optimizer"]


def adopt_optimizer(
    optimizer: torch.optim.Optimizer,
    module: nn.Module,
    copy_of: Callable[[nn.Parameter], Optional[nn.Parameter]],
) -> torch.optim.Optimizer:
    """Replace, in ``optimizer``'s groups and state, each trainable parameter of ``module``
    by ``copy_of(parameter)``; return ``optimizer``.

    Parameters that already are copies stay (adopting twice changes nothing); a frozen
    parameter of ``module`` (no copy) stays too: it receives no gradient, so the optimizer
    skips it as it did before. Raises ``ValueError``, changing nothing, for a parameter that
    is not ``module``'s: it would be stepped on the optimizer thread while the main thread
    uses it.
    """
    own = {id(p): p for p in module.parameters()}
    copies = {id(c) for c in (copy_of(p) for p in own.values() if p.requires_grad) if c is not None}
    replacement: Dict[int, nn.Parameter] = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            if id(param) in own:
                copy = copy_of(param) if param.requires_grad else None
                if copy is not None:
                    replacement[id(param)] = copy
            elif id(param) not in copies:
                raise ValueError(
                    "RoundPipe.adopt_optimizer(): the optimizer holds a parameter that is not "
                    f"one of the wrapped module's (shape {tuple(param.shape)}); RoundPipe's "
                    "optimizer may only step the module's parameters"
                )
    for group in optimizer.param_groups:
        params: List[nn.Parameter] = group["params"]
        group["params"] = [replacement.get(id(p), p) for p in params]
    for old_id, copy in replacement.items():
        old = own[old_id]
        if old in optimizer.state:
            optimizer.state[copy] = optimizer.state.pop(old)
    return optimizer
