"""What a failed step function leaves behind, and the catch-and-continue loop.

The contract (docs/runtime.md, "When a step function fails"): a ``model.step()`` that
raises the previous step's error still queues its own step; a failed step's gradients are
dropped; a failed synchronous step leaves the model with the optimizer's current weights;
the GradScaler counts a failed iteration only if its inf/NaN result was recorded before
the error. The reference below applies that contract with plain torch ops.
"""

from __future__ import annotations

import random
import struct
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch

from roundpipe import GradScaler, RoundPipe
from runtime_refs import BatchList, loss_of, make_data, make_net

INIT_SCALE, GROWTH_INTERVAL = 2.0**10, 3


class InjectedFailure(Exception):
    """Raised by a step function on purpose; ``args[0]`` is the iteration it belongs to."""


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _bitwise(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


class LaggedRule:
    """update() of iteration k applies iteration k-1's result; None (a step that failed
    before recording one) changes neither the scale nor the growth tracker."""

    def __init__(self) -> None:
        self.scale, self.tracker, self.pending = _f32(INIT_SCALE), 0, None

    def update(self, found_inf: Optional[bool]) -> None:
        if self.pending is True:
            self.scale, self.tracker = _f32(self.scale * 0.5), 0
        elif self.pending is False:
            self.tracker += 1
            if self.tracker == GROWTH_INTERVAL:
                grown = _f32(self.scale * 2.0)
                self.scale = grown if grown != float("inf") else self.scale
                self.tracker = 0
        self.pending = found_inf


# plan[k]: "ok", "overflow" (inf written into a gradient), "fail_before" (the step
# function raises before touching anything) or "fail_after" (it raises after scaler.step).
Plan = Dict[int, str]


def _step_function(k: int, plan: Plan, scaler, opt, copies):
    def step_fn() -> None:
        kind = plan.get(k, "ok")
        if kind == "fail_before":
            raise InjectedFailure(k)
        if kind == "overflow":
            with torch.no_grad():
                copies[0].grad.view(-1)[0] = float("inf")
        scaler.step(opt)
        if kind == "fail_after":
            raise InjectedFailure(k)
        opt.zero_grad()

    return step_fn


def train_catching(batches, plan: Plan, is_async: bool = True):
    """The natural loop: catch the step's error around ``model.step`` and go on."""
    net = make_net()
    model = RoundPipe(net)
    copies = list(model.optim_parameters())
    opt = torch.optim.SGD(copies, lr=0.05, momentum=0.9)
    scaler = GradScaler(INIT_SCALE, growth_interval=GROWTH_INTERVAL)
    scales: List[float] = []
    caught: List[Tuple[int, int]] = []  # (iteration that caught it, iteration that failed)
    for k, (x, y) in enumerate(batches):
        scales.append(scaler.get_scale())
        model.forward_backward((x,), label=y, loss_fn=lambda o, l: scaler.scale(loss_of(o, l)))
        try:
            model.step(_step_function(k, plan, scaler, opt, copies), is_async=is_async)
        except InjectedFailure as failure:
            caught.append((k, failure.args[0]))
        scaler.update(is_async=is_async)
    try:
        model.synchronize()
    except InjectedFailure as failure:
        caught.append((len(scales), failure.args[0]))
    scales.append(scaler.get_scale())
    return scales, caught, [p.detach().clone() for p in net.parameters()]


def contract_reference(batches, plan: Plan, is_async: bool = True):
    """The same training with plain torch ops, applying the documented contract."""
    net = make_net()
    params = list(net.parameters())
    masters = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt = torch.optim.SGD(masters, lr=0.05, momentum=0.9)
    rule = LaggedRule()
    scales: List[float] = []
    for k, (x, y) in enumerate(batches):
        scales.append(rule.scale)
        scale = torch.tensor(rule.scale, dtype=torch.float32)
        (loss_of(net(x), y) * scale).backward()
        for p, m in zip(params, masters):
            m.grad, p.grad = p.grad, None
        if is_async:  # the model takes the result of step k-1 before step k runs
            _copy(params, masters)
        kind = plan.get(k, "ok")
        result: Optional[bool] = None
        if kind != "fail_before":
            if kind == "overflow":
                with torch.no_grad():
                    masters[0].grad.view(-1)[0] = float("inf")
            result = not all(torch.isfinite(m.grad).all() for m in masters)
            with torch.no_grad():
                for m in masters:
                    m.grad.mul_(scale.double().reciprocal().float())
            if not result:
                opt.step()
        opt.zero_grad()  # a failed step's gradients are dropped as well
        if is_async:
            rule.update(result)
        else:  # update(is_async=False): this iteration's own result, applied at once
            rule.pending = result
            rule.update(None)
            _copy(params, masters)
    scales.append(rule.scale)
    _copy(params, masters)
    return scales, [p.detach().clone() for p in params]


def _copy(params: Sequence[torch.Tensor], masters: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, m in zip(params, masters):
            p.copy_(m)


def _expected_catches(plan: Plan, is_async: bool = True) -> List[Tuple[int, int]]:
    """Asynchronous: step k's error reaches the model.step() of iteration k+1 (or the final
    synchronize()); synchronous: the model.step() that ran it."""
    return [(k + int(is_async), k) for k in sorted(plan) if plan[k].startswith("fail")]


@pytest.mark.parametrize("plan", [
    {3: "fail_before"},
    {3: "fail_after"},
    {2: "overflow", 3: "fail_before", 4: "fail_after", 7: "overflow", 8: "fail_before"},
    {11: "fail_before"},  # the last step: its error comes from the final synchronize()
], ids=["fail-before", "fail-after", "mixed", "last-step"])
def test_the_catch_and_continue_loop_follows_the_contract(plan):
    batches = make_data(12)
    scales, caught, weights = train_catching(batches, plan)
    want_scales, want_weights = contract_reference(batches, plan)
    assert caught == _expected_catches(plan)
    assert scales == want_scales
    assert _bitwise(weights, want_weights)


@pytest.mark.parametrize("plan", [{3: "fail_after"}, {2: "overflow", 3: "fail_before", 5: "fail_after"}],
                         ids=["fail-after", "mixed"])
def test_synchronous_steps_raise_their_own_failure_and_follow_the_contract(plan):
    batches = make_data(8)
    scales, caught, weights = train_catching(batches, plan, is_async=False)
    want_scales, want_weights = contract_reference(batches, plan, is_async=False)
    assert caught == _expected_catches(plan, is_async=False)
    assert scales == want_scales
    assert _bitwise(weights, want_weights)


def test_a_failed_synchronous_step_leaves_the_model_with_the_optimizers_weights():
    net = make_net()
    model = RoundPipe(net)
    copies = list(model.optim_parameters())
    opt = torch.optim.SGD(copies, lr=0.5)
    (x, y), = make_data(1)
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    before = [p.detach().clone() for p in net.parameters()]

    def steps_then_fails():
        opt.step()
        raise InjectedFailure(0)

    with pytest.raises(InjectedFailure) as caught:
        model.step(steps_then_fails, is_async=False)
    assert any("step function 1 of this model failed" in n for n in caught.value.__notes__)
    assert _bitwise(list(net.parameters()), copies)
    assert not _bitwise(list(net.parameters()), before)  # the optimizer did step
    assert all(c.grad is None for c in copies)  # and its gradients were dropped


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.skipif("fork" not in torch.multiprocessing.get_all_start_methods(), reason="needs fork")
def test_stress_dataloader_workers_injected_failures_and_overflows_match_the_contract():
    """Three epochs through DataLoader(num_workers=2) with fork (new workers each epoch, forked
    while a step is pending), step functions that fail before or after scaler.step, and
    random overflows; the loop catches every failure and goes on."""
    rng = random.Random(11)
    epoch = make_data(40, seed=7)
    batches = epoch * 3
    plan: Plan = {}
    for k in range(len(batches)):
        roll = rng.random()
        if roll < 0.08:
            plan[k] = "fail_before"
        elif roll < 0.16:
            plan[k] = "fail_after"
        elif roll < 0.28:
            plan[k] = "overflow"
    loader = torch.utils.data.DataLoader(
        BatchList(epoch), batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=30)
    streamed = (batch for _ in range(3) for batch in loader)
    scales, caught, weights = train_catching(streamed, plan)
    want_scales, want_weights = contract_reference(batches, plan)
    assert caught == _expected_catches(plan)
    assert len(caught) >= 10 and list(plan.values()).count("overflow") >= 10
    assert scales == want_scales
    assert len(set(scales)) > 3  # the scale did move both ways
    assert _bitwise(weights, want_weights)
