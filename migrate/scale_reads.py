"""The loss scale read between the backward and ``scaler.update()``.

``scale = scaler.get_scale()`` before ``scaler.step(optimizer)`` (or between the step and the
update), compared with ``scaler.get_scale()`` after the update to tell a skipped step, holds
on the main thread of RoundPipe the scale of the iteration being scaled, not the one the
optimizer thread's step used: the comparison would no longer tell an overflow. Such a read,
which is no statement of the step itself (a norm divided by the scale is one, and moves into
the step function), is refused at its own line (RPM134) instead of ending the step group
where no step then follows. Without ``--exact``, so is a comparison of the scale after the
update (the skip-the-scheduler-on-overflow idiom): the asynchronous step has not run yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .plan import Blocked
from .syntax import assigned_names, code, method_call, names_in, only_assignment

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["refuse_scale_compared_after_update", "refuse_scale_read_inside_step"]


def refuse_scale_read_inside_step(step: "StepBuilder") -> None:
    """Raise :class:`Blocked` (RPM134) for the first statement after the backward, in its
    block and before the statement calling ``scaler.update()``, that is a simple statement
    calling ``scaler.get_scale()`` and no step statement; nothing when no update follows there."""
    after = step.body[step.index + 1 :]
    updates = [i for i, statement in enumerate(after) if _calls(step, statement, "update")]
    for statement in after[: updates[0]] if updates else []:
        simple = isinstance(statement, cst.SimpleStatementLine)  # an `if` around it is the step group's to judge
        if simple and step.classify(statement) is None and _calls(step, statement, "get_scale"):
            raise Blocked(
                statement,
                "RPM134",
                f"`{code(statement).strip()}` reads the loss scale between the backward and "
                f"`{step.scaler}.update()`: in RoundPipe the main thread's get_scale() is the scale of the "
                "iteration it scales, not the one the asynchronous step used, so comparing it across the "
                "update no longer tells a skipped step; read it inside the step, or migrate by hand",
            )


def refuse_scale_compared_after_update(step: "StepBuilder") -> None:
    """Without ``--exact``: raise :class:`Blocked` (RPM134) for the first statement after
    ``scaler.update()`` in the backward's block that compares ``scaler.get_scale()``, or a
    name of that block assigned from it (``scale_before = scaler.get_scale()`` before the
    backward), to tell a skipped step (``if not skipped: scheduler.step()``): the scale after
    the update is only known once the asynchronous step has run. A scale only logged is not
    refused."""
    if step.rules.exact:
        return
    after = step.body[step.index + 1 :]
    updates = [i for i, statement in enumerate(after) if _calls(step, statement, "update")]
    held = {
        name
        for statement in step.body
        if (assign := only_assignment(statement)) is not None and _calls(step, assign.value, "get_scale")
        for name in assigned_names(statement)
    }
    for statement in after[updates[0] + 1 :] if updates else []:
        for comparison in step.facts.subtree(statement, cst.Comparison):
            if _calls(step, comparison, "get_scale") or held & set(names_in(comparison)):
                raise Blocked(
                    statement,
                    "RPM134",
                    f"`{code(comparison)}` compares the loss scale across `{step.scaler}.update()` to tell a "
                    "skipped step: with the asynchronous step the scale after the update is only known once that "
                    "step has run; use --exact (the step then finishes in place), or migrate by hand",
                )


def _calls(step: "StepBuilder", statement: cst.CSTNode, method: str) -> bool:
    return any(method_call(call, step.scaler, method) for call in step.facts.subtree(statement, cst.Call))
