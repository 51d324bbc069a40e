"""What a recognised training step is, as frozen values the step rules are handed.

:class:`StepGroup` holds the optimizer statements found after the backward
(:func:`migrate.rules.step_function.find_step_group`); :class:`RecognisedStep` adds the
optimizer they step and the model it trains, once both are known. The step rules take a
:class:`RecognisedStep` besides their context (the :class:`~migrate.steps.StepBuilder`)
instead of those three values apart; a rule that cuts the group (:mod:`migrate.multi_step`,
:mod:`migrate.joint_steps`) builds a new one, never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import libcst as cst

__all__ = ["RecognisedStep", "StepGroup"]


@dataclass(frozen=True)
class StepGroup:
    """The optimizer statements of a recognised step: ``statements`` are
    ``block.body[start:end]``; ``condition`` is the ``if`` around them (gradient
    accumulation), else None."""

    block: cst.CSTNode
    start: int
    end: int
    statements: Tuple[cst.BaseStatement, ...]
    condition: Optional[cst.If]


@dataclass(frozen=True)
class RecognisedStep:
    """One training step as the step rules plan it: its optimizer statements (``group``),
    the optimizer they step and the model that optimizer trains, each name spelled as at
    the step (``self.model`` in a method). Built where the step's optimizer and model are
    found (:meth:`migrate.steps.StepBuilder.plan`; one per optimizer for several stepped
    after one backward, :mod:`migrate.joint_steps`; the AMP step's for its plain path,
    :mod:`migrate.plain_path`)."""

    group: StepGroup
    optimizer: str
    model: str
