"""A GradScaler chosen by a conditional expression whose every branch builds one.

Scripts pick the scaler's device or settings inline::

    scaler = GradScaler("cuda") if use_cuda else GradScaler("cpu")
    self.scaler = GradScaler(init_scale=2.**16) if fp16 else GradScaler(init_scale=1.0, enabled=False)

Exactly one branch runs and each builds a torch GradScaler, so the target holds a
GradScaler either way: every construction is rewritten as one (:mod:`migrate.torch_amp`
plans each it finds), and the target is followed once, from the first of them
(:func:`first_of_branches`). Branches may nest (``A if p else B if q else C``); a branch
that is anything else (``None``, a scaler handed in) is not this shape.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from .names import ModuleFacts

__all__ = ["first_of_branches"]


def first_of_branches(facts: ModuleFacts, value: cst.BaseExpression, call: cst.Call) -> Optional[cst.Call]:
    """When ``value`` is a conditional expression each branch of which (nested ones
    included) is a torch GradScaler construction, one of them ``call``: the first of them,
    from which the target is followed; else None."""
    if not isinstance(value, cst.IfExp):
        return None
    branches = _branches(value)
    if call not in branches or not all(isinstance(b, cst.Call) and _builds_scaler(facts, b) for b in branches):
        return None
    first = branches[0]
    return first if isinstance(first, cst.Call) else None


def _branches(value: cst.BaseExpression) -> List[cst.BaseExpression]:
    """The leaves of a (nested) conditional expression, in source order."""
    if isinstance(value, cst.IfExp):
        return [*_branches(value.body), *_branches(value.orelse)]
    return [value]


def _builds_scaler(facts: ModuleFacts, call: cst.Call) -> bool:
    try:
        return facts.scaler_kind(call) is not None
    except ValueError:  # an ambiguous spelling: refused where the construction is planned
        return False
