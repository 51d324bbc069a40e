"""How long the runtime keeps the model's gradient buffers: never longer than the plain loop
would, whatever the caller does to ``param.grad`` or however it mixes step modes."""

from __future__ import annotations

import gc
import weakref
from typing import Callable, List, Sequence, Tuple

import pytest
import torch

from roundpipe import RoundPipe
from runtime_refs import loss_of, make_data, make_net

Batches = Sequence[Tuple[torch.Tensor, torch.Tensor]]


def _sgd_model() -> Tuple[RoundPipe, Callable[[], None]]:
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1, momentum=0.9)
    return model, lambda: (opt.step(), opt.zero_grad())


def _model_grads(model: RoundPipe) -> List[weakref.ref]:
    grads = [p.grad for p in model.model.parameters()]
    assert all(g is not None for g in grads)
    return [weakref.ref(g) for g in grads]


def _alive(refs: List[weakref.ref]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


@pytest.mark.parametrize("is_async", [False, True])
@pytest.mark.parametrize("drop", ["zero_grad", "assign_none"])
def test_a_gradient_buffer_the_caller_drops_after_a_step_is_freed(is_async, drop):
    # The plain loop frees a gradient once param.grad lets go of it; so must the runtime's
    # record of the zeroed buffers it handed back.
    model, step_fn = _sgd_model()
    for x, y in make_data(3):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(step_fn, is_async=is_async)
    buffers = _model_grads(model)
    if drop == "zero_grad":
        model.model.zero_grad(set_to_none=True)
    else:
        for p in model.model.parameters():
            p.grad = None
    assert _alive(buffers) == 0
    model.synchronize()


@pytest.mark.parametrize("switch", ["sync_step", "synchronize"])
def test_leaving_asynchronous_steps_keeps_no_released_gradient_buffers(switch):
    # The last asynchronous step's gradients are released when it finishes; a synchronous
    # step or synchronize() after it must not keep them for a later asynchronous step.
    model, step_fn = _sgd_model()
    data = make_data(4)
    for x, y in data[:3]:
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        last_async = _model_grads(model)  # handed to the step by reference
        model.step(step_fn)
    if switch == "sync_step":
        model.forward_backward((data[3][0],), label=data[3][1], loss_fn=loss_of)
        model.step(step_fn, is_async=False)
    else:
        model.synchronize()
    assert _alive(last_async) == 0
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.model.parameters())


def _mixed_mode_reference(net: torch.nn.Module, data: Batches, schedule: Sequence[str]) -> Tuple[List[float], list]:
    """The plain-torch meaning of a schedule of ``"async"``, ``"sync"`` and ``"synchronize"``
    (docs/runtime.md, "Threads and staleness"): the model runs on the weights it was last
    given; an asynchronous step gives it the copies' values before stepping them, a
    synchronous step after, ``synchronize()`` gives it the newest."""
    masters = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
    opt = torch.optim.SGD(masters, lr=0.1, momentum=0.9)
    batches = iter(data)
    losses = []

    def give_weights() -> None:
        with torch.no_grad():
            for p, m in zip(net.parameters(), masters):
                p.copy_(m)

    for what in schedule:
        if what == "synchronize":
            give_weights()
            continue
        x, y = next(batches)
        loss = loss_of(net(x), y)
        loss.backward()
        if what == "async":
            give_weights()
        for p, m in zip(net.parameters(), masters):
            m.grad, p.grad = p.grad, None
        opt.step()
        opt.zero_grad()
        if what == "sync":
            give_weights()
        losses.append(loss.item())
    give_weights()
    return losses, [p.detach().clone() for p in net.parameters()]


SCHEDULE = ["async", "async", "sync", "async", "synchronize", "async", "async", "sync", "sync", "async", "synchronize"]


def test_mixing_step_modes_keeps_the_documented_weight_order_bitwise():
    steps = sum(what != "synchronize" for what in SCHEDULE)
    data = make_data(steps)
    ref_losses, ref_params = _mixed_mode_reference(make_net(), data, SCHEDULE)
    model, step_fn = _sgd_model()
    batches = iter(data)
    losses = []
    for what in SCHEDULE:
        if what == "synchronize":
            model.synchronize()
            continue
        x, y = next(batches)
        losses.append(model.forward_backward((x,), label=y, loss_fn=loss_of).item())
        model.step(step_fn, is_async=what == "async")
    model.synchronize()
    assert losses == ref_losses
    assert all(torch.equal(p, r) for p, r in zip(model.model.parameters(), ref_params))
