"""What a recognised training step is, as frozen values the step rules are handed.

:class:`StepGroup` holds the optimizer statements found after the backward
(:func:`migrate.rules.step_function.find_step_group`); a rule that cuts the group
(:mod:`migrate.multi_step`, :mod:`migrate.joint_steps`) builds a new one, never changes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import libcst as cst

__all__ = ["StepGroup"]


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
