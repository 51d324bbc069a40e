"""The loss scale read between the backward and ``scaler.update()``.

``scale = scaler.get_scale()`` before ``scaler.step(optimizer)`` (or between the step and the
update), compared with ``scaler.get_scale()`` after the update to tell a skipped step, holds
on the main thread of RoundPipe the scale of the iteration being scaled, not the one the
optimizer thread's step used: the comparison would no longer tell an overflow. Such a read,
which is no statement of the step itself (a norm divided by the scale is one, and moves into
the step function), is refused at its own line (RPM134) instead of ending the step group
where no step then follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .plan import Blocked
from .syntax import code, method_call

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["refuse_scale_read_inside_step"]


def refuse_scale_read_inside_step(step: "StepBuilder") -> None:
    """Raise :class:`Blocked` (RPM134) for the first statement after the backward, in its
    block and before the statement calling ``scaler.update()``, that calls
    ``scaler.get_scale()`` and is no step statement; nothing when no update follows there."""
    after = step.body[step.index + 1 :]
    updates = [i for i, statement in enumerate(after) if _calls(step, statement, "update")]
    for statement in after[: updates[0]] if updates else []:
        if step.classify(statement) is None and _calls(step, statement, "get_scale"):
            raise Blocked(
                statement,
                "RPM134",
                f"`{code(statement).strip()}` reads the loss scale between the backward and "
                f"`{step.scaler}.update()`: in RoundPipe the main thread's get_scale() is the scale of the "
                "iteration it scales, not the one the asynchronous step used, so comparing it across the "
                "update no longer tells a skipped step; read it inside the step, or migrate by hand",
            )


def _calls(step: "StepBuilder", statement: cst.CSTNode, method: str) -> bool:
    return any(method_call(call, step.scaler, method) for call in step.facts.subtree(statement, cst.Call))
