"""unscale_/step called on the main thread run inline when the optimizer thread is idle, and
the order of work is what it was when they were always queued: after every earlier job,
seeing its effects, with its errors delivered first."""

import threading

import pytest
import torch

from roundpipe import GradScaler, optim_stream
from scaler_loops import reference_scales, train


class _RecordingSGD(torch.optim.SGD):
    """SGD that notes, at each step, the thread it ran on and the gradient it applied."""

    def __init__(self, params, log):
        super().__init__(params, lr=1.0)
        self.log = log

    def step(self, closure=None):
        grad = self.param_groups[0]["params"][0].grad
        self.log.append(("step", threading.current_thread().name, grad.clone()))
        return super().step(closure)


def _one_param(log, grad_value=8.0):
    param = torch.nn.Parameter(torch.zeros(2))
    param.grad = torch.full((2,), grad_value)
    return param, _RecordingSGD([param], log)


def _hold_the_stream(order, seconds=0.05):
    """Queue a job that is still running when the main thread goes on."""
    gate = threading.Event()
    job = optim_stream.launch(lambda: (gate.wait(10), order.append("queued job")))
    threading.Timer(seconds, gate.set).start()
    return job


def test_a_plain_loop_steps_on_the_calling_thread_and_counts_as_waited():
    log = []
    param, opt = _one_param(log)
    scaler = GradScaler(4.0)
    optim_stream.synchronize()
    scaler.scale(torch.ones((), requires_grad=True))
    scaler.unscale_(opt)
    scaler.step(opt)
    assert log[0][1] == threading.current_thread().name
    assert optim_stream.waited_seq() == optim_stream.launched_seq()
    scaler.update()
    assert scaler.get_scale() == 4.0  # the result was applied at once: torch's sequence
    assert torch.equal(param.detach(), torch.full((2,), -2.0))


def test_an_unscale_after_a_queued_job_runs_after_it_and_sees_its_gradients():
    order = []
    log = []
    param, opt = _one_param(log, grad_value=1.0)
    scaler = GradScaler(4.0)
    scaler.scale(torch.ones((), requires_grad=True))

    def write_grads():
        order.append("queued job")
        param.grad.fill_(8.0)

    gate = threading.Event()
    optim_stream.launch(gate.wait, 10)
    optim_stream.launch(write_grads)
    threading.Timer(0.05, gate.set).start()
    scaler.unscale_(opt)  # queued behind write_grads, not run inline before it
    order.append("unscale_ returned")
    assert order == ["queued job", "unscale_ returned"]
    assert torch.equal(param.grad, torch.full((2,), 2.0))


def test_an_inline_step_sees_the_effects_of_earlier_queued_work():
    order, log = [], []
    param, opt = _one_param(log, grad_value=4.0)
    scaler = GradScaler(4.0)
    scaler.scale(torch.ones((), requires_grad=True))
    _hold_the_stream(order)
    scaler.unscale_(opt)  # behind the queued job
    assert order == ["queued job"]
    scaler.step(opt)  # now the stream is idle: inline, after the queued unscale_
    assert log[0][1] == threading.current_thread().name
    assert torch.equal(log[0][2], torch.ones(2))
    scaler.update()


def test_an_error_from_an_earlier_queued_job_surfaces_at_unscale_which_then_does_not_run():
    log = []
    param, opt = _one_param(log)
    scaler = GradScaler(4.0)
    scaler.scale(torch.ones((), requires_grad=True))

    def failing_step_fn():
        raise KeyError("earlier step function")

    optim_stream.launch(failing_step_fn)
    with pytest.raises(KeyError, match="earlier step function"):
        scaler.unscale_(opt)
    assert torch.equal(param.grad, torch.full((2,), 8.0))  # the unscale_ was cancelled
    scaler.unscale_(opt)  # the error was delivered once; now it runs (inline)
    assert torch.equal(param.grad, torch.full((2,), 2.0))
    scaler.step(opt)
    scaler.update()


@pytest.mark.parametrize("path", ["inline", "queued"])
def test_a_failed_unscale_counts_as_a_fault_for_update_whichever_path_ran_it(path):
    torch.manual_seed(0)
    fp16 = torch.nn.Linear(3, 2).half()
    opt = torch.optim.SGD(fp16.parameters(), lr=0.1)
    scaler = GradScaler(4.0)
    scaler.scale(fp16(torch.randn(2, 3).half()).float().sum()).backward()
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients."):
        if path == "inline":
            scaler.unscale_(opt)
        else:
            optim_stream.launch(scaler.unscale_, opt).wait()
    scaler.update()  # the failed job is a fault, not "No inf checks were recorded"
    assert scaler.get_scale() == 4.0


def test_the_inline_loop_keeps_torchs_sequence_with_clipping():
    pattern = [0, "inf", 0, 0, "nan", 0, 0, 0]
    ours = train(lambda: GradScaler(64.0, growth_interval=2), pattern, clip=0.5)
    theirs = train(lambda: torch.amp.GradScaler("cpu", 64.0, growth_interval=2), pattern, clip=0.5)
    assert ours[0] == theirs[0] == reference_scales(64.0, [bool(f) for f in pattern], interval=2)
    assert ours[1] == theirs[1]
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))
