"""The scale tensor is shared with the iteration records and copied only when a job that
has not been waited for could still read it: unscaling always divides by the value that
iteration's loss was multiplied by, and a plain loop makes no copies."""

import threading

import torch

from roundpipe import GradScaler, optim_stream


def _param_with_grad(value):
    param = torch.nn.Parameter(torch.zeros(1))
    param.grad = torch.full((1,), value)
    return param, torch.optim.SGD([param], lr=0.0)


def _gated_unscale(scaler, opt):
    gate = threading.Event()
    job = optim_stream.launch(lambda: (gate.wait(10), scaler.unscale_(opt)))
    return gate, job


def test_a_queued_unscale_keeps_its_scale_when_update_sets_a_new_one():
    param, opt = _param_with_grad(64.0)
    scaler = GradScaler(64.0)
    scaler.scale(torch.ones(()))
    gate, job = _gated_unscale(scaler, opt)
    scaler.update(new_scale=2.0)  # applied now, while the unscale_ still waits to run
    gate.set()
    job.wait()
    assert param.grad.item() == 1.0  # divided by 64, not by 2
    assert scaler.get_scale() == 2.0


def test_a_queued_unscale_keeps_its_scale_when_the_lagged_result_is_applied():
    param, opt = _param_with_grad(float("inf"))
    scaler = GradScaler(64.0)
    scaler.scale(torch.ones(()))
    optim_stream.launch(scaler.step, opt)  # iteration 1 finds an inf
    scaler.update()  # lagged: nothing applied yet
    optim_stream.synchronize()
    param.grad = torch.full((1,), 64.0)
    scaler.scale(torch.ones(()))  # iteration 2 multiplies by 64
    gate, job = _gated_unscale(scaler, opt)
    scaler.update()  # applies iteration 1's backoff while iteration 2's unscale_ is queued
    gate.set()
    job.wait()
    assert param.grad.item() == 1.0
    assert scaler.get_scale() == 32.0
    optim_stream.launch(scaler.step, opt).wait()
    scaler.update()


def test_a_plain_loop_updates_one_scale_tensor_in_place_without_copies():
    param, opt = _param_with_grad(1.0)
    scaler = GradScaler(64.0, growth_interval=1)
    scaler.scale(torch.ones(()))
    live = scaler._get_scale_async()
    for step in range(4):
        if step:
            scaler.scale(torch.ones(()))
        param.grad = torch.full((1,), 1.0)
        scaler.step(opt)
        scaler.update()
        assert scaler._get_scale_async() is live
    assert scaler.get_scale() == 64.0 * 2**4
