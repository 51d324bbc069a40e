"""Gradients read on the main thread after a migrated step.

``model.step`` hands the model's gradients over to the optimizer copies, so after it the
model's parameters hold none, and the optimizer copies' gradients belong to the optimizer
thread. A ``.grad`` read that the original made after ``optimizer.step()`` (a gradient norm
or histogram logged after the step, before the next ``zero_grad``) would see other values
(RPM140). Reads between a backward and its step keep working (the gradients are still on the
model), as do reads in statements that move into the step function.

Only the functions holding a migrated step are looked at; a helper called after the step
that reads gradients is not seen.
"""

from __future__ import annotations

from typing import Dict, List, Union

import libcst as cst

from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code

__all__ = ["check_gradient_reads"]

Holder = Union[cst.FunctionDef, cst.Module]


def check_gradient_reads(facts: ModuleFacts, plan: Plan) -> None:
    """Raise :class:`Blocked` (RPM140) at the first ``.grad`` read that a function holding a
    migrated step makes after that step, outside the statements moved into it."""
    moved: Dict[int, List[int]] = {}  # id(holder) -> orders of the moved step statements
    holders: Dict[int, Holder] = {}
    for statement in plan.step_statements:
        holder = facts.enclosing(statement, (cst.FunctionDef,)) or facts.module
        holders[id(holder)] = holder
        moved.setdefault(id(holder), []).append(facts.order(statement))
    for key, holder in holders.items():
        backwards = sorted(
            facts.order(b) for b in plan.backward_statements if facts.within(b, holder) and b is not holder
        )
        for attribute in facts.subtree(holder, cst.Attribute):
            if attribute.attr.value != "grad" or _is_write(facts, attribute):
                continue
            if any(facts.within(attribute, s) for s in plan.step_statements):
                continue
            if not _after_a_step(facts.order(attribute), backwards, moved[key]):
                continue
            raise Blocked(
                attribute,
                "RPM140",
                f"`{code(facts.statement_of(attribute)).strip()}` reads gradients after the optimizer "
                "step; once migrated, model.step has handed them to the optimizer copies, so this "
                "would read other values; read them before the step, or migrate by hand",
            )


def _after_a_step(order: int, backwards: List[int], steps: List[int]) -> bool:
    """A read at ``order`` may see gradients a step has taken: a moved step statement comes
    between it and the latest backward before it (or, in a function with no backward, the
    function's start); in a function with backwards, a read before all of them (the next
    iteration of a loop) counts too."""
    earlier = [b for b in backwards if b < order]
    if not earlier:
        return bool(backwards) or any(s < order for s in steps)
    return any(earlier[-1] < s < order for s in steps)


def _is_write(facts: ModuleFacts, attribute: cst.Attribute) -> bool:
    """``p.grad = None``: a target, not a read."""
    parent = facts.parent(attribute)
    return isinstance(parent, cst.AssignTarget) and parent.target is attribute
