"""Pointing the user's optimizers at RoundPipe's optimizer copies; apex's ``master_params``.

RoundPipe trains separate copies of the model's parameters (fp32 masters under O2). After
``initialize`` every optimizer passed to it is the *same object*, with its param groups
holding the copies instead of the model's parameters and its per-parameter state moved to
them. An optimizer may span several models.
"""

from __future__ import annotations

from typing import Dict, Iterator

import torch
from torch import nn

from ..optimizer_adoption import move_onto_copies

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
    """Replace, in place, each parameter of ``optimizer`` found in ``copy_of`` by its copy,
    moving its state (:func:`roundpipe.optimizer_adoption.move_onto_copies`: floating state
    takes the copy's dtype). Parameters without a copy (frozen ones, or ones of no wrapped
    model) stay as they are. The optimizer is marked, so a second ``initialize`` with it is
    refused.
    """
    move_onto_copies(optimizer, copy_of)
    setattr(optimizer, _MARK, True)


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every parameter of every param group of ``optimizer``, in order (apex's
    ``amp.master_params``). After ``initialize`` these are RoundPipe's optimizer copies:
    the fp32 masters under O2, the parameters the optimizer steps in every level."""
    for group in optimizer.param_groups:
        yield from group["params"]
