"""The apex column: apex amp in a plain loop against ``roundpipe.compat`` on the same seed.

Runs only where apex (<= 25.05, which still has ``apex.amp``) imports, on CUDA. The apex run
is the reference: its loss-scale trajectory, skipped steps and amp state must be identical
to ``roundpipe.compat``'s and the parameters close (apex's O1 patches torch functions where
roundpipe uses ``torch.autocast``, so op-by-op precision differs; O2 does no patching).

Every scenario of :data:`~compat_matrix.scenarios.SCENARIOS` without an apex counterpart is
skipped with its reason; :data:`APEX_SCENARIOS` adds rows for apex's own rules, with the
apex settings of :data:`APEX_SETTINGS`: bounds applied only when halving/growing, one scale
per loss (``num_losses``), static-scale bookkeeping, and O2 gradient accumulation (one
``scale_loss`` block per micro-batch, unscaled into the fp32 masters at each exit).

Faults are written into the first parameter's gradient *during* backward (a gradient
hook), so both sides see them inside the ``scale_loss`` block, where apex checks.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import torch

import roundpipe.compat
from roundpipe.compat.global_casts import stop_casting

from .runners import Trace, _optimizer_tensors, _snapshot
from .scenarios import Scenario, loss_of, make_batches, make_model, make_optimizers

__all__ = [
    "APEX_BOUND",
    "APEX_REASON",
    "APEX_SCENARIOS",
    "APEX_SETTINGS",
    "ApexSettings",
    "apex_skip_reason",
    "fault_during_backward",
    "opt_level_for",
    "run_apex",
    "run_compat",
]

APEX_BOUND = 5e-2
APEX_REASON = "apex O1/O2 patches torch functions where roundpipe.compat uses torch.autocast"


@dataclass(frozen=True)
class ApexSettings:
    """apex-only settings of a scenario (``amp.initialize`` arguments, faults per block).

    ``faults``: ``(step, micro-batch, loss id)`` blocks whose gradient gets an inf; None
    uses the scenario's faults (micro-batch 0, loss 0).
    """

    opt_level: Optional[str] = None
    loss_scale: Optional[object] = None
    min_loss_scale: Optional[float] = None
    max_loss_scale: float = 2.0**24
    num_losses: int = 1
    faults: Optional[Tuple[Tuple[int, int, int], ...]] = None


APEX_SCENARIOS: List[Scenario] = [
    Scenario(
        "apex_bounds",
        "apex O2, min_loss_scale above the first scale and a low cap: "
        "the floor applies only when halving, the cap only when growing",
        model_dtype=torch.float16,
        init_scale=2.0**12,
        growth_interval=2,
        faults=(0, "inf", 0, 0, 0, 0, 0, 0, "inf"),
    ),
    Scenario(
        "apex_per_loss_scales",
        "apex O2, num_losses=2: each loss has its own scale; a step is skipped when any loss overflowed",
        model_dtype=torch.float16,
        growth_interval=2,
    ),
    Scenario(
        "apex_static_bookkeeping",
        "apex O2 with a static loss_scale=128: the unskipped counter counts every block and is never reset",
        model_dtype=torch.float16,
        accumulate=2,
    ),
    Scenario(
        "apex_o2_accumulation",
        "apex O2 with gradient accumulation over 3 scale_loss blocks, overflows in the first and in a later block",
        model_dtype=torch.float16,
        accumulate=3,
        steps=10,
        growth_interval=4,
    ),
]

APEX_SETTINGS: Dict[str, ApexSettings] = {
    "apex_bounds": ApexSettings(min_loss_scale=2.0**13, max_loss_scale=2.0**14),
    "apex_per_loss_scales": ApexSettings(num_losses=2, faults=((1, 0, 1), (3, 0, 0), (4, 0, 1), (4, 0, 0))),
    "apex_static_bookkeeping": ApexSettings(loss_scale=128.0),
    "apex_o2_accumulation": ApexSettings(faults=((2, 0, 0), (5, 1, 0), (7, 2, 0))),
}


def apex_skip_reason(scenario: Scenario) -> Optional[str]:
    """Why a scenario has no apex counterpart (None: it has one)."""
    if scenario.autocast is not None:
        return "apex does its own casting (opt levels): see the O1 rows of the other scenarios"
    if scenario.microbatches > 1:
        return "apex has no microbatches"
    if scenario.optimizer == "two":
        return (
            "apex skips every optimizer of a scale_loss block when any gradient overflows, "
            "torch-style scalers only the optimizer that overflowed; the migration refuses "
            "scale_loss over several optimizers (RPM107)"
        )
    if scenario.resume_at is not None and scenario.resume_format == "torch":
        return "apex checkpoints use amp.state_dict(): see resume_apex_format"
    return None


def _settings(scenario: Scenario) -> ApexSettings:
    return APEX_SETTINGS.get(scenario.name, ApexSettings())


def opt_level_for(scenario: Scenario) -> str:
    level = _settings(scenario).opt_level
    if level is not None:
        return level
    return "O2" if scenario.model_dtype != torch.float32 else "O1"


def _faults(scenario: Scenario) -> Dict[Tuple[int, int, int], str]:
    listed = _settings(scenario).faults
    if listed is not None:
        return {block: "inf" for block in listed}
    return {(step, 0, 0): scenario.fault(step) for step in range(scenario.steps) if scenario.fault(step)}


@contextlib.contextmanager
def fault_during_backward(param: torch.Tensor, fault: Optional[str]) -> Iterator[None]:
    """While active, backward writes ``fault`` ("inf"/"nan"; falsy: nothing) into the first
    element of ``param``'s gradient, inside the ``scale_loss`` block (where apex checks)."""
    if not fault:
        yield
        return

    def poison(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad.view(-1)[0] = float(fault)
        return grad

    handle = param.register_hook(poison)
    try:
        yield
    finally:
        handle.remove()


def _fp32(scenario: Scenario) -> Scenario:
    """apex (and roundpipe.compat) want fp32 models; O2 makes the half copy itself."""
    return dataclasses.replace(scenario, model_dtype=torch.float32)


def _initialize(amp, scenario: Scenario, device: str):
    """``amp.initialize`` (apex's or roundpipe.compat's) with the scenario's settings."""
    settings = _settings(scenario)
    base = _fp32(scenario)
    net = make_model(base, device)
    optimizers = make_optimizers(scenario, net.parameters())
    extra = {} if settings.loss_scale is None else {"loss_scale": settings.loss_scale}
    model, optimizers = amp.initialize(
        net,
        optimizers,
        opt_level=opt_level_for(scenario),
        verbosity=0,
        num_losses=settings.num_losses,
        min_loss_scale=settings.min_loss_scale,
        max_loss_scale=settings.max_loss_scale,
        **extra,
    )
    return net, model, optimizers


def _initial_state(scenario: Scenario) -> Dict[str, Dict[str, float]]:
    """The dynamic scenarios start at the scenario's scale (a checkpoint load, as scripts do)."""
    return {
        f"loss_scaler{k}": {"loss_scale": float(scenario.init_scale), "unskipped": 0}
        for k in range(_settings(scenario).num_losses)
    }


def _step_all(masters: Sequence[torch.Tensor], step_fn) -> bool:
    """Run ``step_fn``; True when it changed no master parameter (the step was skipped)."""
    before = _snapshot(masters)
    step_fn()
    return all(torch.equal(a, b) for a, b in zip(before, _snapshot(masters)))


def _block_loss(scenario: Scenario, output, label, step: int, loss_id: int):
    return loss_of(scenario, output, label, step) * (1.0 + loss_id)


def run_apex(scenario: Scenario, device: str) -> Trace:
    """apex amp: ``amp.initialize`` + one ``with amp.scale_loss(...)`` per micro-batch and
    loss + ``optimizer.step()``."""
    from apex import amp

    settings = _settings(scenario)
    net, model, optimizers = _initialize(amp, scenario, device)
    scalers = amp._amp_state.loss_scalers
    for scaler in scalers:
        scaler._scale_seq_len = scenario.growth_interval
    if settings.loss_scale is None:
        amp.load_state_dict(_initial_state(scenario))
    faults = _faults(scenario)
    first = next(net.parameters())
    trace = Trace()
    batches = make_batches(_fp32(scenario), device, scenario.steps)
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            amp.load_state_dict(amp.state_dict())
        trace.scales.append(float(scalers[0].loss_scale()))
        for micro in range(scenario.accumulate):
            x, y = batches[step * scenario.accumulate + micro]
            for loss_id in range(settings.num_losses):
                with fault_during_backward(first, faults.get((step, micro, loss_id))):
                    loss = _block_loss(scenario, model(x), y, step, loss_id)
                    with amp.scale_loss(loss, optimizers, loss_id=loss_id) as scaled:
                        scaled.backward()

        def step_fn() -> None:
            for opt in optimizers:
                if scenario.clip is not None:
                    torch.nn.utils.clip_grad_norm_(list(amp.master_params(opt)), scenario.clip)
                opt.step()
                opt.zero_grad()

        masters = [p for opt in optimizers for p in amp.master_params(opt)]
        trace.skipped.append(_step_all(masters, step_fn))
        trace.losses.append(loss.item())
        trace.params.append(_snapshot(model.parameters()))
    trace.optimizer_state = _optimizer_tensors(optimizers)
    trace.scaler_state = dict(amp.state_dict())
    return trace


def run_compat(scenario: Scenario, device: str) -> Trace:
    """The migrated form: ``roundpipe.compat.initialize``, one ``forward_backward`` per
    ``scale_loss`` block, synchronous RoundPipe steps. O1's thread-wide autocast ends with
    the run, so the matrix's next runs compute without it."""
    try:
        return _run_compat(scenario, device)
    finally:
        stop_casting()


def _run_compat(scenario: Scenario, device: str) -> Trace:
    amp = roundpipe.compat
    settings = _settings(scenario)
    net, model, optimizers = _initialize(amp, scenario, device)
    scalers = [amp.loss_scaler(k) for k in range(settings.num_losses)]
    for scaler in scalers:
        scaler.set_growth_interval(scenario.growth_interval)
    if settings.loss_scale is None:
        amp.load_state_dict(_initial_state(scenario))
    faults = _faults(scenario)
    first = next(net.parameters())
    trace = Trace()
    batches = make_batches(_fp32(scenario), device, scenario.steps)
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            model.synchronize()
            amp.load_state_dict(amp.state_dict())
        trace.scales.append(float(scalers[0].get_scale()))
        for micro in range(scenario.accumulate):
            x, y = batches[step * scenario.accumulate + micro]
            for loss_id, scaler in enumerate(scalers):

                def loss_fn(out, label, s=scaler, k=loss_id):
                    return s.scale(_block_loss(scenario, out, label, step, k))

                with fault_during_backward(first, faults.get((step, micro, loss_id))):
                    loss = model.forward_backward((x,), label=y, loss_fn=loss_fn) / scaler.get_scale()
        skipped: List[bool] = []

        def step_fn() -> None:
            def steps() -> None:
                for opt in optimizers:
                    if scenario.clip is not None:
                        scalers[0].unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(list(amp.master_params(opt)), scenario.clip)
                    scalers[0].step(opt)
                    opt.zero_grad()

            skipped.append(_step_all([p for opt in optimizers for p in amp.master_params(opt)], steps))

        model.step(step_fn, is_async=False)
        scalers[0].update(is_async=False)
        trace.skipped.append(skipped[0])
        trace.losses.append(loss.item())
        trace.params.append(_snapshot(net.parameters()))
    trace.optimizer_state = _optimizer_tensors(optimizers)
    trace.scaler_state = dict(amp.state_dict())
    return trace
