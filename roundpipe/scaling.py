"""Kernels the GradScaler drives: grouped unscale + inf check, and the scale update rule.

Everything here is a thin, allocation-light layer over torch's fused AMP kernels:

* :func:`unscale_grads_` groups an optimizer's gradients by ``(device, dtype)`` and runs one
  ``torch._amp_foreach_non_finite_check_and_unscale_`` call per group, with one ``found_inf``
  tensor per device shared by every dtype on that device (exactly torch's grouping).
* :func:`update_scale_` runs ``torch._amp_update_scale_`` on the scale's device and then the
  optional clamp to ``[min_scale, max_scale]``.

Contracts shared by every function: no host synchronisation (no ``.item()``), tensors are
modified in place, and the caller is responsible for running on the right thread and CUDA
stream. The functions are thread-agnostic.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Optional, Sequence

import torch

__all__ = [
    "FoundInfPerDevice",
    "reciprocal_scale",
    "unscale_grads_",
    "sum_found_inf",
    "update_scale_",
]

FoundInfPerDevice = Dict[torch.device, torch.Tensor]
"""One 0-dim float32 tensor per device that had gradients: 1.0 if a non-finite value was seen."""


def reciprocal_scale(scale: torch.Tensor) -> torch.Tensor:
    """Return ``1/scale`` computed in float64 and rounded to float32 (torch's inv_scale).

    Args:
        scale: 0-dim float32 scale tensor, any device.

    Returns:
        A new 0-dim float32 tensor on ``scale.device``. No host sync.
    """
    return scale.double().reciprocal().float()


def _gradients_to_unscale(
    param_groups: Iterable[dict], allow_fp16: bool
) -> Dict[torch.device, Dict[torch.dtype, List[torch.Tensor]]]:
    """Collect the tensors to unscale, grouped by device then dtype, in first-seen order.

    Validation happens for every parameter before any kernel runs, so a rejected fp16
    gradient leaves every gradient untouched (torch's behaviour).
    """
    groups: Dict[torch.device, Dict[torch.dtype, List[torch.Tensor]]] = defaultdict(lambda: defaultdict(list))
    for group in param_groups:
        for param in group["params"]:
            if not isinstance(param, torch.Tensor):
                raise AssertionError(f"expected param to be torch.Tensor, got {type(param).__name__}")
            grad = param.grad
            if grad is None:
                continue
            if not allow_fp16 and grad.dtype == torch.float16:
                raise ValueError("Attempting to unscale FP16 gradients.")
            if grad.is_sparse:
                # Duplicate indices of a scaled fp16 sparse grad may overflow when summed,
                # so check the coalesced values.
                if grad.dtype is torch.float16:
                    param.grad = grad = grad.coalesce()
                values = grad._values()
            else:
                values = grad
            groups[values.device][values.dtype].append(values)
    return groups


def unscale_grads_(
    param_groups: Iterable[dict],
    inv_scale: torch.Tensor,
    allow_fp16: bool,
) -> FoundInfPerDevice:
    """Multiply every gradient by ``inv_scale`` in place and record non-finite values.

    Args:
        param_groups: an optimizer's ``param_groups`` (walked in order).
        inv_scale: 0-dim float32 multiplier; ``1.0`` checks without changing any value.
        allow_fp16: accept float16 gradients (the fused-optimizer check path does).

    Returns:
        ``{device: found_inf}`` for each device that had gradients; each ``found_inf`` is a
        fresh 0-dim float32 tensor on that device, 1.0 when an inf/NaN was seen, else 0.0.
        Empty when no parameter has a gradient.

    Raises:
        ValueError: ``"Attempting to unscale FP16 gradients."`` (before touching anything).

    One fused kernel call per ``(device, dtype)``; no host sync; runs under ``no_grad``.
    """
    found_inf_per_device: FoundInfPerDevice = {}
    with torch.no_grad():
        groups = _gradients_to_unscale(param_groups, allow_fp16)
        for device, per_dtype in groups.items():
            found_inf = torch.zeros((), dtype=torch.float32, device=device)
            device_inv_scale = inv_scale.to(device, non_blocking=True)
            for grads in per_dtype.values():
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, device_inv_scale)
            found_inf_per_device[device] = found_inf
    return found_inf_per_device


def sum_found_inf(found_infs: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum ``found_inf`` tensors onto ``device`` without modifying any of them.

    Returns a 0-dim float32 tensor (0.0 when ``found_infs`` is empty); a single input already
    on ``device`` is returned as is (read-only use). No host sync.
    """
    if len(found_infs) == 1 and found_infs[0].device == device:
        return found_infs[0]
    total = torch.zeros((), dtype=torch.float32, device=device)
    for found_inf in found_infs:
        total.add_(found_inf.to(device, non_blocking=True))
    return total


def update_scale_(
    scale: torch.Tensor,
    growth_tracker: torch.Tensor,
    found_inf: torch.Tensor,
    growth_factor: float,
    backoff_factor: float,
    growth_interval: int,
    min_scale: Optional[float] = None,
    max_scale: Optional[float] = None,
) -> None:
    """Apply one iteration's result to ``scale`` and ``growth_tracker`` in place.

    The rule is ``torch._amp_update_scale_`` (backoff on a non-zero ``found_inf``; growth
    after ``growth_interval`` consecutive clean results, kept only if finite), followed by a
    clamp to ``[min_scale, max_scale]`` when either bound is given.

    Args:
        scale: 0-dim float32 tensor, modified in place.
        growth_tracker: 0-dim int32 tensor on the same device, modified in place.
        found_inf: 0-dim float32 tensor on the same device.

    No host sync on any device.
    """
    torch._amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval)
    if min_scale is not None or max_scale is not None:
        scale.clamp_(min=min_scale, max=max_scale)
