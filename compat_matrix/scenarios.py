"""The rows of the parity matrix: small seeded training scenarios with injected faults.

A scenario fixes everything a run depends on (model, data, optimizer, scaler settings,
which steps overflow or produce a NaN loss, clipping, accumulation, autocast, checkpoint
resume), so that every runner trains exactly the same thing and traces can be compared
bit for bit. Faults are injected independently of the scale (an inf/NaN written into one
gradient, or a NaN loss), so the overflow pattern is the same for every runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

__all__ = ["Scenario", "SCENARIOS", "scenario_names", "make_batches"]


@dataclass(frozen=True)
class Scenario:
    """One row group of the matrix. ``faults[k]`` is 0, "inf" or "nan" for step k."""

    name: str
    description: str
    steps: int = 12
    faults: Tuple = ()
    nan_loss_steps: Tuple[int, ...] = ()
    init_scale: float = 2.0**10
    growth_interval: int = 3
    optimizer: str = "sgd"  # sgd | adamw | fused_adam | two
    clip: Optional[float] = None
    accumulate: int = 1
    model_dtype: torch.dtype = torch.float32  # fp16/bf16 model -> fp32 master copies
    autocast: Optional[torch.dtype] = None
    resume_at: Optional[int] = None  # checkpoint after this many steps, resume in a new run
    resume_format: str = "torch"  # torch | apex
    microbatches: int = 1

    def fault(self, step: int):
        return self.faults[step] if step < len(self.faults) else 0


def _pattern(steps: int, marks: Dict[int, str]) -> Tuple:
    return tuple(marks.get(k, 0) for k in range(steps))


SCENARIOS: List[Scenario] = [
    Scenario("clean", "no overflow; steady training", faults=()),
    Scenario(
        "forced_overflow",
        "inf gradients on chosen steps: backoff and skipped steps",
        faults=_pattern(12, {2: "inf", 3: "inf", 7: "nan"}),
    ),
    Scenario("growth", "growth every 2 clean steps", growth_interval=2, init_scale=1.0),
    Scenario("nan_loss", "a NaN loss on one step", nan_loss_steps=(4,)),
    Scenario("clipping", "unscale_ then clip_grad_norm_ before step", clip=0.5, faults=_pattern(12, {5: "inf"})),
    Scenario(
        "accumulation",
        "gradient accumulation over 2 micro-steps",
        accumulate=2,
        steps=16,
        faults=_pattern(16, {5: "inf"}),
    ),
    Scenario("two_optimizers", "two optimizers on one scaler", optimizer="two", faults=_pattern(12, {6: "inf"})),
    Scenario(
        "fused_adam",
        "torch's fused Adam through the fused-optimizer protocol",
        optimizer="fused_adam",
        faults=_pattern(12, {4: "nan"}),
    ),
    Scenario(
        "fp16_master_weights",
        "fp16 model, fp32 master weights (apex O2 style)",
        model_dtype=torch.float16,
        optimizer="adamw",
        faults=_pattern(12, {3: "inf"}),
    ),
    Scenario(
        "bf16_autocast",
        "bf16 autocast around forward and loss",
        autocast=torch.bfloat16,
        faults=_pattern(12, {6: "inf"}),
    ),
    Scenario(
        "fp16_autocast",
        "fp16 autocast around forward and loss",
        autocast=torch.float16,
        faults=_pattern(12, {6: "inf"}),
    ),
    Scenario(
        "resume_torch_format",
        "checkpoint after 6 steps, resume from a torch-format state dict",
        resume_at=6,
        faults=_pattern(12, {3: "inf", 8: "inf"}),
    ),
    Scenario(
        "resume_apex_format",
        "checkpoint after 6 steps, resume from an apex amp.state_dict()",
        resume_at=6,
        resume_format="apex",
        faults=_pattern(12, {3: "inf", 8: "inf"}),
    ),
    Scenario(
        "microbatches",
        "RoundPipe with 2 microbatches against the full batch",
        microbatches=2,
        faults=_pattern(12, {5: "inf"}),
    ),
]


def scenario_names() -> List[str]:
    return [s.name for s in SCENARIOS]


def make_model(scenario: Scenario, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    return model.to(device=device, dtype=scenario.model_dtype)


def make_batches(scenario: Scenario, device: str, steps: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(steps * scenario.accumulate):
        x = torch.randn(8, 8, generator=gen)
        y = torch.randn(8, 2, generator=gen)
        batches.append((x.to(device=device, dtype=scenario.model_dtype), y.to(device)))
    return batches


def make_optimizers(scenario: Scenario, params: Iterable[torch.nn.Parameter]) -> List[torch.optim.Optimizer]:
    params = list(params)
    if scenario.optimizer == "sgd":
        return [torch.optim.SGD(params, lr=0.05, momentum=0.9)]
    if scenario.optimizer == "adamw":
        return [torch.optim.AdamW(params, lr=0.01, weight_decay=0.01)]
    if scenario.optimizer == "fused_adam":
        return [torch.optim.Adam(params, lr=0.01, fused=True)]
    if scenario.optimizer == "two":
        return [torch.optim.SGD(params[:2], lr=0.05), torch.optim.AdamW(params[2:], lr=0.01)]
    raise ValueError(f"unknown optimizer {scenario.optimizer!r}")


def loss_of(scenario: Scenario, output: torch.Tensor, target: torch.Tensor, step: int) -> torch.Tensor:
    loss = torch.nn.functional.mse_loss(output.float(), target.float())
    if step in scenario.nan_loss_steps:
        loss = loss * float("nan")
    return loss / scenario.accumulate


def inject(scenario: Scenario, params: Sequence[torch.nn.Parameter], step: int) -> None:
    """Write the step's fault into the first gradient (any thread, under no_grad)."""
    fault = scenario.fault(step)
    if fault:
        with torch.no_grad():
            first = next(p.grad for p in params if p.grad is not None)
            first.view(-1)[0] = float(fault)


def autocast_context(scenario: Scenario, device: str):
    if scenario.autocast is None:
        return torch.autocast(device_type=device, enabled=False)
    return torch.autocast(device_type=device, dtype=scenario.autocast)
