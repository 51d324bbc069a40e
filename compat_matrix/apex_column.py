"""The apex column: apex amp in a plain loop against ``roundpipe.compat`` on the same seed.

Runs only where apex (<= 25.05, which still has ``apex.amp``) imports, on CUDA. The apex run
is the reference: its loss-scale trajectory must be identical to ``roundpipe.compat``'s
(the same dynamic rule, both capped at 2**24) and the parameters close (apex's O1 patches
torch functions where roundpipe uses ``torch.autocast``, so op-by-op precision differs).
O1 for fp32 scenarios, O2 (fp16 model, fp32 masters) for the fp16-master scenario.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

import roundpipe.compat

from .runners import Trace, _optimizer_tensors, _snapshot, _step_recording
from .scenarios import Scenario, inject, loss_of, make_batches, make_model, make_optimizers

__all__ = ["APEX_BOUND", "apex_skip_reason", "opt_level_for", "run_apex", "run_compat"]

APEX_BOUND = 5e-2
APEX_REASON = "apex O1/O2 patches torch functions where roundpipe.compat uses torch.autocast"


def apex_skip_reason(scenario: Scenario) -> Optional[str]:
    """Why a scenario has no apex counterpart (None: it has one)."""
    if scenario.autocast is not None:
        return "apex does its own casting (opt levels): see the O1 rows of the other scenarios"
    if scenario.accumulate > 1:
        return "apex accumulation needs delay_unscale, which RoundPipe does not migrate"
    if scenario.microbatches > 1:
        return "apex has no microbatches"
    if scenario.optimizer == "two":
        return ("apex skips every optimizer of a scale_loss block when any gradient overflows, "
                "torch-style scalers only the optimizer that overflowed; the migration refuses "
                "scale_loss over several optimizers (RPM107)")
    if scenario.resume_at is not None and scenario.resume_format == "torch":
        return "apex checkpoints use amp.state_dict(): see resume_apex_format"
    return None


def opt_level_for(scenario: Scenario) -> str:
    return "O2" if scenario.model_dtype != torch.float32 else "O1"


def _fp32(scenario: Scenario) -> Scenario:
    """apex (and roundpipe.compat) want fp32 models; O2 makes the half copy itself."""
    return dataclasses.replace(scenario, model_dtype=torch.float32)


def _step_all(masters: Sequence[torch.Tensor], step_fn) -> bool:
    """Run ``step_fn``; True when it changed no master parameter (the step was skipped)."""
    before = _snapshot(masters)
    step_fn()
    return all(torch.equal(a, b) for a, b in zip(before, _snapshot(masters)))


def run_apex(scenario: Scenario, device: str) -> Trace:
    """apex amp: ``amp.initialize`` + ``with amp.scale_loss(...)`` + ``optimizer.step()``."""
    from apex import amp

    base = _fp32(scenario)
    model = make_model(base, device)
    optimizers = make_optimizers(scenario, model.parameters())
    model, optimizers = amp.initialize(model, optimizers, opt_level=opt_level_for(scenario), verbosity=0)
    scaler = amp._amp_state.loss_scalers[0]
    scaler._loss_scale = float(scenario.init_scale)
    scaler._scale_seq_len = scenario.growth_interval
    trace = Trace()
    batches = make_batches(base, device, scenario.steps)
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            amp.load_state_dict(amp.state_dict())
        trace.scales.append(float(scaler.loss_scale()))
        x, y = batches[step]
        loss = loss_of(scenario, model(x), y, step)
        with amp.scale_loss(loss, optimizers) as scaled:
            scaled.backward()
            inject(scenario, list(model.parameters()), step)

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
    state = amp.state_dict()["loss_scaler0"]
    trace.scaler_state = {"scale": float(state["loss_scale"]), "_growth_tracker": int(state["unskipped"])}
    return trace


def run_compat(scenario: Scenario, device: str) -> Trace:
    """The migrated form: ``roundpipe.compat.initialize`` and synchronous RoundPipe steps."""
    base = _fp32(scenario)
    net = make_model(base, device)
    optimizers = make_optimizers(scenario, net.parameters())
    model, optimizers = roundpipe.compat.initialize(net, optimizers, opt_level=opt_level_for(scenario), verbosity=0)
    scaler = roundpipe.compat.loss_scaler()
    scaler.load_state_dict({"scale": float(scenario.init_scale), "growth_factor": 2.0, "backoff_factor": 0.5,
                            "growth_interval": scenario.growth_interval, "_growth_tracker": 0})
    trace = Trace()
    batches = make_batches(base, device, scenario.steps)
    copies = list(model.optim_parameters())
    for step in range(scenario.steps):
        if scenario.resume_at == step:
            model.synchronize()
            roundpipe.compat.load_state_dict(roundpipe.compat.state_dict())
            scaler.set_growth_interval(scenario.growth_interval)
        trace.scales.append(scaler.get_scale())
        x, y = batches[step]
        loss = model.forward_backward((x,), label=y,
                                      loss_fn=lambda out, lbl, k=step: scaler.scale(loss_of(scenario, out, lbl, k)))
        loss = loss / scaler.get_scale()
        model.step(_step_recording(scenario, scaler, optimizers, copies, step, trace), is_async=False)
        scaler.update(is_async=False)
        trace.losses.append(loss.item())
        trace.params.append(_snapshot(net.parameters()))
    trace.optimizer_state = _optimizer_tensors(optimizers)
    state = roundpipe.compat.state_dict()["loss_scaler0"]
    trace.scaler_state = {"scale": float(state["loss_scale"]), "_growth_tracker": int(state["unskipped"])}
    return trace
