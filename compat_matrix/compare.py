"""What "equal" means for a pair of traces: the verdict of one matrix row.

* ``bitwise``: scales, skipped steps, losses, every parameter after every step, the final
  optimizer state and the final scaler state are identical bit for bit (NaN included).
* ``close``: the row declares a bound and a reason (e.g. a different summation order); the
  scale sequence and the skipped steps must still match exactly, and every parameter,
  loss and state value must lie within the bound.
* ``diverged``: anything else. The first step where the traces part is reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch

from .runners import Trace

__all__ = ["Verdict", "compare_traces", "same_bits"]


@dataclass
class Verdict:
    verdict: str
    reason: str
    max_abs_diff: float
    first_divergence: Optional[int]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Identical dtype, shape and bits (so NaN == NaN and -0.0 != 0.0)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.is_floating_point():
        width = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}[a.element_size()]
        return torch.equal(a.contiguous().view(width), b.contiguous().view(width))
    return torch.equal(a, b)


def _float_bits_equal(x: float, y: float) -> bool:
    return x == y or (math.isnan(x) and math.isnan(y))


def _max_abs(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        diff = (x.double() - y.double()).abs()
        diff = torch.where(torch.isnan(x.double()) & torch.isnan(y.double()), torch.zeros_like(diff), diff)
        if diff.numel():
            worst = max(worst, float(diff.max()))
    return worst


def _first_step_apart(reference: Trace, subject: Trace) -> Optional[int]:
    steps = max(len(reference.scales), len(subject.scales))
    for k in range(steps):
        try:
            if reference.scales[k] != subject.scales[k] or reference.skipped[k] != subject.skipped[k]:
                return k
            if not _float_bits_equal(reference.losses[k], subject.losses[k]):
                return k
            if not all(same_bits(x, y) for x, y in zip(reference.params[k], subject.params[k])):
                return k
        except IndexError:
            return k
    return None


def compare_traces(reference: Trace, subject: Trace, bound: Optional[float] = None, reason: str = "") -> Verdict:
    """The verdict for ``subject`` against ``reference`` (``bound``: allow ``close``)."""
    apart = _first_step_apart(reference, subject)
    states_equal = (
        len(reference.optimizer_state) == len(subject.optimizer_state)
        and all(same_bits(x, y) for x, y in zip(reference.optimizer_state, subject.optimizer_state))
        and reference.scaler_state == subject.scaler_state
    )
    params_ref: List[torch.Tensor] = [t for step in reference.params for t in step]
    params_sub: List[torch.Tensor] = [t for step in subject.params for t in step]
    worst = max(
        _max_abs(params_ref, params_sub),
        _max_abs(reference.optimizer_state, subject.optimizer_state),
        _max_abs([torch.tensor(reference.losses)], [torch.tensor(subject.losses)]),
    )
    if apart is None and states_equal:
        return Verdict("bitwise", "identical bits at every step", 0.0, None)
    same_shape = (
        reference.scales == subject.scales
        and reference.skipped == subject.skipped
        and len(params_ref) == len(params_sub)
        and reference.scaler_state == subject.scaler_state
    )
    if bound is not None and same_shape and worst <= bound:
        return Verdict(
            "close",
            f"{reason}; bound: every parameter, loss and optimizer-state value within "
            f"{bound:g} (absolute) of the reference; scale and skipped steps identical",
            worst,
            apart,
        )
    detail = "scale/skip sequences differ" if not same_shape else f"largest absolute difference {worst:.3g}"
    return Verdict("diverged", f"{detail}; first difference at step {apart}", worst, apart)
