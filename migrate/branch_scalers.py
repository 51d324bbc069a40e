"""A trainer's GradScaler built in either branch of an ``if`` in ``__init__`` (issue 10, shape 1).

MMEngine-style optimizer wrappers choose the scaler's arguments by a flag::

    def __init__(self, ..., dynamic=True, scale=512.0):
        if dynamic:
            self.loss_scaler = GradScaler()
        else:
            self.loss_scaler = GradScaler(init_scale=scale, growth_factor=1, backoff_factor=1)

Exactly one of the assignments runs per instance, and each builds a torch GradScaler, so
the attribute holds a GradScaler either way: every construction is rewritten as one
(:mod:`migrate.torch_amp`), and the attribute is followed from its first binding
(:func:`scaler_in_branches`), the others counting as neither reads nor further bindings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from .syntax import exclusive, only_assignment

if TYPE_CHECKING:
    from .attributes import InstanceFamily

__all__ = ["scaler_in_branches"]


def scaler_in_branches(family: "InstanceFamily", writes: List[cst.Attribute]) -> Optional[cst.Attribute]:
    """The first of ``writes`` (the bindings of one attribute) when they all sit in one
    ``__init__`` outside any loop, each pair in different branches of one ``if`` (one runs),
    each a plain one-target assignment of a torch GradScaler construction; else None."""
    facts = family.facts
    methods = {family.method_of(write) for write in writes}
    method = methods.pop() if len(methods) == 1 else None
    if method is None or method.name.value != "__init__" or len(writes) < 2:
        return None
    statements = [facts.statement_of(write) for write in writes]
    for write, statement in zip(writes, statements):
        small = only_assignment(statement)
        if small is None or len(small.targets) != 1 or small.targets[0].target is not write:
            return None
        if not isinstance(small.value, cst.Call) or _scaler_kind(family, small.value) is None:
            return None
        if any(isinstance(a, (cst.For, cst.While)) and facts.within(a, method) for a in facts.ancestors(write)):
            return None
    pairs = [(a, b) for i, a in enumerate(statements) for b in statements[i + 1 :]]
    if not all(exclusive(facts, a, b) for a, b in pairs):
        return None
    return min(writes, key=facts.order)


def _scaler_kind(family: "InstanceFamily", call: cst.Call) -> object:
    try:
        return family.facts.scaler_kind(call)
    except ValueError:  # an ambiguous spelling: refused where the construction is planned
        return None
