"""ModelExecutePlan: upstream's per-stage execution plan, accepted for compatibility.

Upstream RoundPipe splits a model's layers into forward/backward stages across GPUs. On one
device the whole model is a single stage, so a plan is validated but has no effect.
"""

from __future__ import annotations

from typing import Any, List, Union

__all__ = ["ModelExecutePlan"]

_RUN_TYPES = ("infer", "train", "fused")


class ModelExecutePlan:
    """Forward and backward stage ranges (``fwd_plan``/``bwd_plan``: lists of ``range``)."""

    def __init__(self) -> None:
        self.fwd_plan: List[range] = []
        self.bwd_plan: List[range] = []

    def check_valid(self, num_layers: int, run_type: str) -> None:
        """Raise ``ValueError`` unless each plan covers layers ``0..num_layers-1`` in order."""
        if run_type not in _RUN_TYPES:
            raise ValueError(f"run_type must be one of {_RUN_TYPES}, got {run_type!r}")
        plans = [("fwd_plan", self.fwd_plan)]
        if run_type != "infer":
            plans.append(("bwd_plan", self.bwd_plan))
        for label, plan in plans:
            covered = [layer for stage in plan for layer in stage]
            if covered != list(range(num_layers)):
                raise ValueError(f"{label} must cover layers 0..{num_layers - 1} in order, got {plan}")

    @classmethod
    def auto(
        cls,
        run_type: str,
        *models: Any,
        min_stages: int = 1,
        upper_threshold: float = 1.1,
        model_memory_limit: float = float("inf"),
    ) -> Union["ModelExecutePlan", List["ModelExecutePlan"]]:
        """One single-stage plan per model (one per model when several are given)."""
        if run_type not in _RUN_TYPES:
            raise ValueError(f"run_type must be one of {_RUN_TYPES}, got {run_type!r}")
        plans = []
        for _ in models:
            plan = cls()
            plan.fwd_plan = [range(0, 1)]
            plan.bwd_plan = [range(0, 1)] if run_type != "infer" else []
            plans.append(plan)
        return plans[0] if len(plans) == 1 else plans
