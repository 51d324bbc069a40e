"""os.fork() after the optimizer thread has started: an idle parent's child trains on exactly
as the parent would; a child forked while a step was pending fails at once, never hangs;
DataLoader workers forked during asynchronous training change nothing."""

from __future__ import annotations

import os
import pickle
import select
import signal
import threading
import time
from typing import Any, Callable, List

import pytest
import torch

from roundpipe import GradScaler, RoundPipe, optim_stream
from runtime_refs import BatchList, loss_of, make_data, make_net

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork"),
    pytest.mark.timeout(60),
]
CHILD_SECONDS = 20.0


def in_forked_child(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child and return its result (its exception is re-raised
    here as RuntimeError with the child's message). A child that does not answer within
    CHILD_SECONDS is killed and the test fails: that is the hang being tested for."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os.close(read_end)
        try:
            payload = ("ok", fn())
        except BaseException as exc:  # noqa: BLE001 - everything goes back to the parent
            payload = ("error", f"{type(exc).__name__}: {exc}")
        with os.fdopen(write_end, "wb") as out:
            pickle.dump(payload, out)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as answer:
        ready, _, _ = select.select([answer], [], [], CHILD_SECONDS)
        if not ready:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child hung for {CHILD_SECONDS:.0f} s")
        kind, value = pickle.load(answer)
    os.waitpid(pid, 0)
    if kind == "error":
        raise RuntimeError(value)
    return value


class Training:
    """RoundPipe + GradScaler with asynchronous steps and the lagged update."""

    def __init__(self) -> None:
        self.net = make_net()
        self.model = RoundPipe(self.net)
        self.opt = torch.optim.SGD(self.model.optim_parameters(), lr=0.05, momentum=0.9)
        self.scaler = GradScaler(2.0**10, growth_interval=2)
        self.scales: List[float] = []

    def step_fn(self) -> None:
        self.scaler.step(self.opt)
        self.opt.zero_grad()

    def iterate(self, batches, step_fn=None) -> None:
        for x, y in batches:
            self.scales.append(self.scaler.get_scale())
            self.model.forward_backward((x,), label=y, loss_fn=lambda o, l: self.scaler.scale(loss_of(o, l)))
            self.model.step(step_fn or self.step_fn)
            self.scaler.update()

    def result(self):
        self.model.synchronize()
        return self.scales + [self.scaler.get_scale()], [p.detach().clone() for p in self.net.parameters()]


def test_a_child_forked_while_the_optimizer_is_idle_trains_on_like_the_parent():
    first, rest = make_data(4, seed=2), make_data(5, seed=3)
    training = Training()
    training.iterate(first)
    training.model.synchronize()  # idle: nothing queued or running

    def go_on():
        training.iterate(rest)
        return training.result()

    child_scales, child_weights = in_forked_child(go_on)
    parent_scales, parent_weights = go_on()
    assert child_scales == parent_scales
    assert all(torch.equal(a, b) for a, b in zip(child_weights, parent_weights))


def test_a_scaler_in_a_plain_loop_goes_on_in_a_forked_child():
    """The scaler alone: unscale_/step run as optimizer jobs even in a plain loop."""
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    scaler = GradScaler(2.0**10, growth_interval=1)

    def iterations(count: int) -> List[float]:
        for x, y in make_data(count, seed=4):
            scaler.scale(loss_of(net(x), y)).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
        return [scaler.get_scale()] + [p.detach().clone() for p in net.parameters()]

    iterations(2)
    child = in_forked_child(lambda: iterations(3))
    parent = iterations(3)
    assert child[0] == parent[0] == 2.0**15
    assert all(torch.equal(a, b) for a, b in zip(child[1:], parent[1:]))


def test_a_child_forked_while_a_step_is_pending_fails_at_once_with_a_clear_error():
    training = Training()
    gate = threading.Event()
    training.iterate(make_data(1), step_fn=lambda: (gate.wait(30), training.step_fn()))

    def use_the_stream():
        messages = []
        for use in (training.model.synchronize, lambda: training.iterate(make_data(1)),
                    lambda: optim_stream.launch(print)):
            started = time.monotonic()
            try:
                use()
                messages.append("no error")
            except RuntimeError as err:
                messages.append((str(err), time.monotonic() - started))
        return messages

    try:
        messages = in_forked_child(use_the_stream)
    finally:
        gate.set()
    for message in messages:
        assert message != "no error"
        text, seconds = message
        assert "was forked while" in text and "model.synchronize() first" in text
        assert seconds < 1.0
    training.result()  # the parent is unaffected


def _loader(batches, worker_init_fn=None) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(
        BatchList(batches), batch_size=None, num_workers=2, multiprocessing_context="fork",
        worker_init_fn=worker_init_fn, timeout=CHILD_SECONDS,
    )


def test_dataloader_workers_forked_during_asynchronous_training_change_nothing():
    batches = make_data(6, seed=5)
    with_workers, plain = Training(), Training()
    slow = lambda: (time.sleep(0.01), with_workers.step_fn())  # noqa: E731 - keeps a step pending
    for _ in range(3):  # every epoch forks two new workers, each while a step is pending
        with_workers.iterate(_loader(batches), step_fn=slow)
        plain.iterate(batches)
    got, want = with_workers.result(), plain.result()
    assert got[0] == want[0]
    assert all(torch.equal(a, b) for a, b in zip(got[1], want[1]))


def test_a_dataloader_worker_that_touches_the_model_fails_at_once_or_works():
    training = Training()
    batches = make_data(2, seed=6)
    training.model.synchronize()
    idle = [x for x, _ in _loader(batches, lambda worker: training.model.synchronize())]
    assert len(idle) == 2  # forked while idle: the workers' synchronize() returned
    gate = threading.Event()
    training.iterate(make_data(1), step_fn=lambda: (gate.wait(30), training.step_fn()))
    try:
        with pytest.raises(RuntimeError, match="was forked while"):
            list(_loader(batches, lambda worker: training.model.synchronize()))
    finally:
        gate.set()
    training.result()


def test_a_scaler_lock_held_by_the_optimizer_thread_at_the_fork_does_not_hang_the_child():
    scaler = GradScaler(8.0)
    scaler.scale(torch.ones(()))
    held, gate = threading.Event(), threading.Event()
    optim_stream.launch(lambda: (scaler._lock.acquire(), held.set(), gate.wait(30), scaler._lock.release()))
    held.wait(10)
    try:
        # a new iteration's first scale() takes the lock to fix that iteration's scale
        child = in_forked_child(lambda: (scaler.update(new_scale=4.0), scaler.scale(torch.ones(())).item()))
    finally:
        gate.set()
    assert child[1] == 4.0
