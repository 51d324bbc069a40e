"""RoundPipeRunConfig: per-call and per-model run settings, resolved field by field.

Every field defaults to None, meaning "not set here". A value is resolved in this order: the
per-call config, then the model-level config given to ``RoundPipe(...)``, then the built-in
default of this one-device runtime (see :data:`DEFAULTS`).
"""

from __future__ import annotations

import copy
from typing import Any, Optional

import torch

__all__ = ["RoundPipeRunConfig", "resolve"]

_FIELDS = (
    "requires_grad",
    "output_device",
    "preserve_rng_state",
    "recompute_grain",
    "num_microbatch",
    "split_input",
    "split_label",
    "merge_output",
    "execute_plan",
)

DEFAULTS = {
    # requires_grad: torch.is_grad_enabled() at call time (computed in resolve()).
    "output_device": None,  # leave outputs where the model computed them
    "preserve_rng_state": True,  # accepted; nothing is recomputed on one device
    "recompute_grain": "stage",  # accepted; nothing is recomputed on one device
    "num_microbatch": 1,
    "split_input": None,  # automatic splitting of args and kwargs
    "split_label": None,  # automatic splitting of the label
    "merge_output": True,  # automatic merge
    "execute_plan": None,  # accepted; the whole model is one stage on one device
}


class RoundPipeRunConfig:
    """Run settings for ``RoundPipe`` (upstream's fields, names and order).

    Honoured by this runtime: ``requires_grad``, ``output_device``, ``num_microbatch``,
    ``split_input``, ``split_label``, ``merge_output``. Accepted and ignored, because one
    device has no pipeline stages to plan or recompute: ``preserve_rng_state``,
    ``recompute_grain``, ``execute_plan``.
    """

    def __init__(
        self,
        requires_grad: Optional[bool] = None,
        output_device: Optional[torch.device] = None,
        preserve_rng_state: Optional[bool] = None,
        recompute_grain: Optional[str] = None,
        num_microbatch: Optional[int] = None,
        split_input: Any = None,
        split_label: Any = None,
        merge_output: Any = None,
        execute_plan: Any = None,
    ) -> None:
        if num_microbatch is not None and (
            not isinstance(num_microbatch, int) or isinstance(num_microbatch, bool) or num_microbatch < 1
        ):
            raise ValueError(f"num_microbatch must be a positive int, got {num_microbatch!r}")
        if recompute_grain not in (None, "stage", "layer"):
            raise ValueError(f"recompute_grain must be 'stage' or 'layer', got {recompute_grain!r}")
        self.requires_grad = requires_grad
        self.output_device = None if output_device is None else torch.device(output_device)
        self.preserve_rng_state = preserve_rng_state
        self.recompute_grain = recompute_grain
        self.num_microbatch = num_microbatch
        self.split_input = split_input
        self.split_label = split_label
        self.merge_output = merge_output
        self.execute_plan = copy.deepcopy(execute_plan)

    def __repr__(self) -> str:
        set_fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS if getattr(self, name) is not None)
        return f"RoundPipeRunConfig({set_fields})"


def resolve(call: RoundPipeRunConfig, model: RoundPipeRunConfig, name: str) -> Any:
    """The value of field ``name``: per-call, else model-level, else the built-in default."""
    for config in (call, model):
        value = getattr(config, name)
        if value is not None:
            return value
    if name == "requires_grad":
        return torch.is_grad_enabled()
    return DEFAULTS[name]
