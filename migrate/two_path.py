"""The two branches of a two-path training step: the AMP step in one branch of an
``if``/``else``, the plain (non-AMP) path in the other (:mod:`migrate.plain_path`).

The step rules (one step, several steps, a backward feeding a later one) ask which
statements belong to the other branch, to leave them to the plain path; this module answers
from the step's block alone, below every rule that asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import libcst as cst

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["other_branch"]


def other_branch(step: "StepBuilder") -> List[cst.BaseStatement]:
    """The statements of the other branch of the ``if``/``else`` whose body or ``else``
    holds the step's backward (none when there is no such ``if``): the plain path of a
    two-path step, which the step's own rules must leave to
    :func:`migrate.plain_path.plan_plain_path`; none for a step of a two-path split, whose
    ``if`` picks only the backward (:mod:`migrate.apex_two_path`)."""
    if step.split is not None:
        return []
    owner = step.facts.parent(step.block)
    statement = step.facts.parent(owner) if isinstance(owner, cst.Else) else owner
    if not isinstance(statement, cst.If) or not isinstance(statement.orelse, cst.Else):
        return []
    other = statement.orelse.body if statement.body is step.block else statement.body
    return list(other.body) if isinstance(other, cst.IndentedBlock) else []
