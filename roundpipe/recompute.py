"""Upstream RoundPipe's recompute helpers, for scripts that call them.

Upstream recomputes a stage's forward during backward to save GPU memory and lets a layer
stash tensors for that recompute. This one-device runtime keeps the autograd graph and never
recomputes, so: :func:`doing_recompute` is always False, :func:`save_for_recompute` does
nothing, and :func:`get_recompute_data` raises (it is only meaningful during a recompute).
"""

from __future__ import annotations

from typing import Any

__all__ = ["save_for_recompute", "doing_recompute", "get_recompute_data"]


def save_for_recompute(*data: Any) -> None:
    """Accepted and ignored: nothing is recomputed on one device."""


def doing_recompute() -> bool:
    """Always False: this runtime never re-runs a forward pass for backward."""
    return False


def get_recompute_data() -> Any:
    """Raises ``RuntimeError``: there is never a recompute in progress to read data from."""
    raise RuntimeError(
        "get_recompute_data() is only valid during a recompute, and this one-device "
        "runtime never recomputes (check doing_recompute() first)"
    )
