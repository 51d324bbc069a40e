"""Who trains: the columns of the parity matrix.

Every runner trains one :class:`~compat_matrix.scenarios.Scenario` and returns a
:class:`Trace` (scale used per step, skipped steps, losses, parameters after every step,
final optimizer and scaler state). Runners:

* ``torch``: ``torch.amp.GradScaler`` in a plain loop (the reference);
* ``dropin``: ``roundpipe.GradScaler`` in the very same loop;
* ``exact``: ``RoundPipe`` with ``step(is_async=False)`` + ``update(is_async=False)``;
* ``async``: ``RoundPipe`` with the default asynchronous step and update;
* ``async_reference``: an independent plain-torch loop with staleness 1 and the lagged scale
  rule written out by hand (no roundpipe code), the reference for ``async``;
* ``apex``: apex amp (only where apex <= 25.05 and CUDA are present).

Low-precision models train fp32 master copies: the torch loop does it by hand, RoundPipe
with ``optim_dtype=torch.float32``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch

from roundpipe import GradScaler, RoundPipe, RoundPipeRunConfig

from .scenarios import Scenario, autocast_context, inject, loss_of, make_batches, make_model, make_optimizers

__all__ = ["Trace", "RUNNERS", "apex_unavailable_reason"]


@dataclass
class Trace:
    """What a run did, step by step, on the CPU for comparison."""

    scales: List[float] = field(default_factory=list)
    skipped: List[bool] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    params: List[List[torch.Tensor]] = field(default_factory=list)
    optimizer_state: List[torch.Tensor] = field(default_factory=list)
    scaler_state: Dict[str, Any] = field(default_factory=dict)


def _snapshot(tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    return [t.detach().to("cpu", copy=True) for t in tensors]


def _optimizer_tensors(optimizers: Sequence[torch.optim.Optimizer]) -> List[torch.Tensor]:
    found = []
    for opt in optimizers:
        for group in opt.param_groups:
            for p in group["params"]:
                for value in opt.state.get(p, {}).values():
                    if isinstance(value, torch.Tensor):
                        found.append(value.detach().to("cpu", copy=True))
    return found


def _scaler_state(scaler) -> Dict[str, Any]:
    state = scaler.state_dict()
    return {k: state[k] for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")}


def _to_apex(state: Dict[str, Any]) -> Dict[str, Any]:
    return {"loss_scaler0": {"loss_scale": state["scale"], "unskipped": state["_growth_tracker"]}}


def _resumed(scenario: Scenario, scaler, make: Callable[[], Any], roundpipe_side: bool):
    """A new scaler loaded from ``scaler``'s checkpoint, in the scenario's format."""
    fresh = make()
    if scenario.resume_format == "torch":
        fresh.load_state_dict(scaler.state_dict())
        return fresh
    apex_state = _to_apex(scaler.state_dict())
    if roundpipe_side:  # through roundpipe.compat, as a migrated apex script does
        from roundpipe.compat import load_state_dict
        from roundpipe.compat.scaler import install

        install(fresh, num_losses=1)
        load_state_dict(apex_state)
    else:  # the torch reference reads the apex entry by hand
        entry = apex_state["loss_scaler0"]
        fresh.load_state_dict({"scale": entry["loss_scale"], "growth_factor": 2.0, "backoff_factor": 0.5,
                               "growth_interval": scenario.growth_interval, "_growth_tracker": entry["unskipped"]})
    fresh.set_growth_interval(scenario.growth_interval)
    return fresh


class _Masters:
    """fp32 master copies for a low-precision model (the hand-written torch recipe)."""

    def __init__(self, model: torch.nn.Module, scenario: Scenario) -> None:
        self.model_params = list(model.parameters())
        self.low = scenario.model_dtype != torch.float32
        self.params = (
            [torch.nn.Parameter(p.detach().float().clone()) for p in self.model_params]
            if self.low else self.model_params
        )

    def grads_to_masters(self) -> None:
        if self.low:
            for p, m in zip(self.model_params, self.params):
                m.grad = None if p.grad is None else p.grad.float()
                p.grad = None

    def masters_to_model(self) -> None:
        if self.low:
            with torch.no_grad():
                for p, m in zip(self.model_params, self.params):
                    p.copy_(m)


def _step_recording(scenario, scaler, optimizers, params, step, trace) -> Callable[[], None]:
    """The optimizer side of one step; records whether it was skipped."""

    def step_fn() -> None:
        inject(scenario, params, step)
        before = _snapshot(params)
        for opt in optimizers:
            if scenario.clip is not None:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_([p for g in opt.param_groups for p in g["params"]], scenario.clip)
            scaler.step(opt)
            opt.zero_grad()
        trace.skipped.append(all(torch.equal(a, b) for a, b in zip(before, _snapshot(params))))

    return step_fn


def run_plain(scenario: Scenario, device: str, make_scaler: Callable[[], Any], roundpipe_side: bool) -> Trace:
    """A plain torch loop with ``make_scaler()`` (torch's scaler or ours as a drop-in)."""
    model = make_model(scenario, device)
    masters = _Masters(model, scenario)
    optimizers = make_optimizers(scenario, masters.params)
    scaler = make_scaler()
    trace = Trace()
    batches = make_batches(scenario, device, scenario.steps)
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            scaler = _resumed(scenario, scaler, make_scaler, roundpipe_side)
        trace.scales.append(scaler.get_scale())
        for micro in range(scenario.accumulate):
            x, y = batches[step * scenario.accumulate + micro]
            with autocast_context(scenario, device):
                loss = loss_of(scenario, model(x), y, step)
            scaler.scale(loss).backward()
        masters.grads_to_masters()
        _step_recording(scenario, scaler, optimizers, masters.params, step, trace)()
        scaler.update()
        masters.masters_to_model()
        trace.losses.append(loss.item())
        trace.params.append(_snapshot(model.parameters()))
    trace.optimizer_state = _optimizer_tensors(optimizers)
    trace.scaler_state = _scaler_state(scaler)
    return trace


class _UnscaledLoss:
    """A ``loss_fn`` that back-propagates the scaled loss and logs the unscaled one.

    Logging ``forward_backward(...) / scaler.get_scale()`` breaks once loss x scale
    overflows float32 (a bf16 or clean run can grow the scale to 2**127): the logged value
    becomes inf/NaN while training is fine. ``total`` is the sum over microbatches of the
    unscaled losses, from zero on the CPU, so one microbatch logs the loss bit for bit.
    """

    def __init__(self, scaler: GradScaler, scenario: Scenario, step: int) -> None:
        self.scaler, self.scenario, self.step = scaler, scenario, step
        self.total = torch.zeros((), dtype=torch.float32)

    def __call__(self, out: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
        loss = loss_of(self.scenario, out, label, self.step)
        self.total = self.total + (loss.detach() / self.scenario.microbatches).to("cpu")
        return self.scaler.scale(loss) / self.scenario.microbatches


def run_roundpipe(scenario: Scenario, device: str, is_async: bool) -> Trace:
    """``RoundPipe`` + ``roundpipe.GradScaler``: exact (synchronous) or asynchronous."""
    net = make_model(scenario, device)
    optim_dtype = torch.float32 if scenario.model_dtype != torch.float32 else None
    model = RoundPipe(net, optim_dtype=optim_dtype,
                      model_run_config=RoundPipeRunConfig(num_microbatch=scenario.microbatches))
    copies = list(model.optim_parameters())
    optimizers = make_optimizers(scenario, copies)
    make = lambda: GradScaler(scenario.init_scale, growth_interval=scenario.growth_interval)  # noqa: E731
    scaler = make()
    trace = Trace()
    batches = make_batches(scenario, device, scenario.steps)
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            model.synchronize()
            scaler = _resumed(scenario, scaler, make, roundpipe_side=True)
        trace.scales.append(scaler.get_scale())
        for micro in range(scenario.accumulate):
            x, y = batches[step * scenario.accumulate + micro]
            logged = _UnscaledLoss(scaler, scenario, step)
            with autocast_context(scenario, device):
                model.forward_backward((x,), label=y, loss_fn=logged)
        model.step(_step_recording(scenario, scaler, optimizers, copies, step, trace), is_async=is_async)
        scaler.update(is_async=is_async)
        trace.losses.append(logged.total.item())
        trace.params.append(_snapshot(net.parameters()))
    model.synchronize()
    trace.optimizer_state = _optimizer_tensors(optimizers)
    trace.scaler_state = _scaler_state(scaler)
    return trace


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


class _LaggedScale:
    """The lagged scale rule written out by hand: update k applies iteration k-1's result."""

    def __init__(self, scenario: Scenario) -> None:
        self.scale = _f32(scenario.init_scale)
        self.tracker = 0
        self.interval = scenario.growth_interval
        self.pending: Optional[bool] = None

    def update(self, found_inf_now: bool) -> None:
        if self.pending is not None:
            if self.pending:
                self.scale, self.tracker = _f32(self.scale * 0.5), 0
            else:
                self.tracker += 1
                if self.tracker == self.interval:
                    grown = _f32(self.scale * 2.0)
                    if grown != float("inf"):
                        self.scale = grown
                    self.tracker = 0
        self.pending = found_inf_now


def run_async_reference(scenario: Scenario, device: str) -> Trace:
    """Staleness 1 + the lagged scale, with plain torch ops only (no roundpipe code)."""
    model = make_model(scenario, device)
    model_params = list(model.parameters())
    masters = [torch.nn.Parameter(p.detach().to(torch.float32 if scenario.model_dtype != torch.float32 else p.dtype).clone())
               for p in model_params]
    optimizers = make_optimizers(scenario, masters)
    rule = _LaggedScale(scenario)
    trace = Trace()
    batches = make_batches(scenario, device, scenario.steps)
    previous_result = [m.detach().clone() for m in masters]  # what step k-1 produced
    for step in range(scenario.steps):
        if scenario.resume_at == step:  # a checkpoint is taken after synchronize()
            with torch.no_grad():
                for p, m in zip(model_params, masters):
                    p.copy_(m)
        scale = rule.scale
        trace.scales.append(scale)
        scale_t = torch.tensor(scale, dtype=torch.float32, device=device)
        for micro in range(scenario.accumulate):
            x, y = batches[step * scenario.accumulate + micro]
            with autocast_context(scenario, device):
                loss = loss_of(scenario, model(x), y, step)
            (loss * scale_t).backward()  # one full batch: what the microbatches add up to
        # step k: the model takes step k-1's result, the masters take the gradients
        with torch.no_grad():
            for p, r in zip(model_params, previous_result):
                p.copy_(r)
        for p, m in zip(model_params, masters):
            m.grad = p.grad if p.grad.dtype == m.dtype else p.grad.to(m.dtype)
            p.grad = None
        inject(scenario, masters, step)
        before = [m.detach().clone() for m in masters]
        found_any = False
        inv = torch.tensor(scale, dtype=torch.float64, device=device).reciprocal().float()
        for opt in optimizers:
            params = [p for g in opt.param_groups for p in g["params"]]
            found = any(not torch.isfinite(p.grad).all() for p in params if p.grad is not None)
            found_any |= found
            if getattr(opt, "_step_supports_amp_scaling", False) and scenario.clip is None:
                opt.grad_scale = scale_t
                opt.found_inf = torch.tensor(float(found), device=device)
                opt.step()
                del opt.grad_scale, opt.found_inf
            else:
                with torch.no_grad():
                    for p in params:
                        if p.grad is not None:
                            p.grad.mul_(inv)
                if scenario.clip is not None:
                    torch.nn.utils.clip_grad_norm_(params, scenario.clip)
                if not found:
                    opt.step()
            opt.zero_grad()
        trace.skipped.append(all(torch.equal(a, b) for a, b in zip(before, masters)))
        previous_result = [m.detach().clone() for m in masters]
        rule.update(found_any)
        trace.losses.append(loss.item())
        trace.params.append(_snapshot(model.parameters()))
    trace.optimizer_state = _optimizer_tensors(optimizers)
    trace.scaler_state = {"scale": rule.scale, "growth_factor": 2.0, "backoff_factor": 0.5,
                          "growth_interval": rule.interval, "_growth_tracker": rule.tracker}
    return trace


def apex_unavailable_reason(device: str) -> Optional[str]:
    """Why the apex column cannot run here, or None when it can."""
    if device != "cuda":
        return "apex amp needs CUDA"
    try:
        from apex import amp  # noqa: F401
    except Exception as err:  # noqa: BLE001 - any import failure means no usable apex
        return f"apex.amp is not importable ({type(err).__name__}); apex <= 25.05 is needed"
    return None


RUNNERS: Dict[str, Callable[[Scenario, str], Trace]] = {
    "torch": lambda s, d: run_plain(s, d, lambda: torch.amp.GradScaler(d, s.init_scale, growth_interval=s.growth_interval), False),
    "dropin": lambda s, d: run_plain(s, d, lambda: GradScaler(s.init_scale, growth_interval=s.growth_interval), True),
    "exact": lambda s, d: run_roundpipe(s, d, is_async=False),
    "async": lambda s, d: run_roundpipe(s, d, is_async=True),
    "async_reference": run_async_reference,
}
