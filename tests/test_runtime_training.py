"""RoundPipe training numerics: exact against plain torch loops, staleness 1 when async,
microbatching, the GradScaler sequences, checkpoints and fault handling."""

import _thread
import threading
import traceback
import weakref

import pytest
import torch
import torch.nn.functional as F

import roundpipe
from roundpipe import GradScaler, RoundPipe, RoundPipeRunConfig
from runtime_refs import loss_of, make_data, make_net, master_weight_loop, plain_loop
from scaler_loops import reference_scales

OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "roundpipe_adam": lambda ps: roundpipe.optim.Adam(ps, lr=0.01, weight_decay=0.01),
}


def _bitwise(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def run_roundpipe(net, make_opt, data, is_async, optim_dtype=None, input_dtype=None, record_used=False):
    model = RoundPipe(net, optim_dtype=optim_dtype)
    opt = make_opt(model.optim_parameters())
    used, losses = [], []
    if record_used:
        net.register_forward_pre_hook(lambda m, a: used.append([p.detach().clone() for p in m.parameters()]))
    for x, y in data:
        inp = x if input_dtype is None else x.to(input_dtype)
        loss = model.forward_backward(input_args=(inp,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
        losses.append(loss.item())
    model.synchronize()
    return losses, used, [p.detach().clone() for p in net.parameters()], list(model.optim_parameters())


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_sync_steps_match_the_plain_torch_loop_bitwise(name):
    data = make_data(6)
    ref_losses, ref_params = plain_loop(make_net(), OPTIMIZERS[name], data)
    losses, _, params, _ = run_roundpipe(make_net(), OPTIMIZERS[name], data, is_async=False)
    assert losses == ref_losses
    assert _bitwise(params, ref_params)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_low_precision_model_with_fp32_masters_matches_hand_written_loop(dtype, name):
    data = make_data(5)
    ref_losses, _, ref_masters = master_weight_loop(make_net(dtype), OPTIMIZERS[name], data, input_dtype=dtype)
    losses, _, params, copies = run_roundpipe(
        make_net(dtype), OPTIMIZERS[name], data, False, torch.float32, input_dtype=dtype
    )
    assert losses == ref_losses
    assert _bitwise(copies, ref_masters)
    assert _bitwise(params, [m.to(dtype) for m in ref_masters])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_async_steps_match_an_independent_staleness_one_reference(dtype, name):
    data = make_data(7)
    ref_losses, ref_used, ref_final = master_weight_loop(
        make_net(dtype), OPTIMIZERS[name], data, staleness=1, input_dtype=dtype
    )
    losses, used, params, copies = run_roundpipe(
        make_net(dtype), OPTIMIZERS[name], data, True, torch.float32, input_dtype=dtype, record_used=True
    )
    assert losses == ref_losses
    assert all(_bitwise(a, b) for a, b in zip(used, ref_used))
    assert _bitwise(copies, ref_final)
    assert _bitwise(params, [m.to(dtype) for m in ref_final])


def test_staleness_table_of_upstream_docs():
    """SGD lr=1 and dL/dw=1: the weight each forward sees, as upstream documents it."""
    for is_async, expected in ((True, [0, 0, -1, -2, -3]), (False, [0, -1, -2, -3, -4])):
        w = torch.nn.Parameter(torch.zeros(1))
        holder = torch.nn.Module()
        holder.w = w
        model = RoundPipe(holder)
        opt = torch.optim.SGD(model.optim_parameters(), lr=1.0)
        seen = []

        def forward(_):
            seen.append(w.item())
            return w.sum()

        holder.forward = forward
        for _ in range(5):
            model.forward_backward(input_args=(torch.zeros(1),))
            model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
        model.synchronize()
        assert seen == expected and w.item() == -5


# ---------------------------------------------------------------------- GradScaler
PATTERN = [0, 0, "inf", 0, 0, 0, "inf", 0, 0, 0]


def _scaled_roundpipe(mode):
    data = make_data(len(PATTERN))
    model = RoundPipe(make_net(), optim_dtype=torch.float32)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)
    scaler = GradScaler(2.0**10, growth_interval=2)
    scales = []
    for (x, y), fault in zip(data, PATTERN):
        scales.append(scaler.get_scale())
        model.forward_backward(input_args=(x,), label=y, loss_fn=lambda o, t: scaler.scale(loss_of(o, t)))

        def step_fn(fault=fault):
            if fault:
                opt.param_groups[0]["params"][0].grad.view(-1)[0] = float(fault)
            scaler.step(opt)
            opt.zero_grad()

        model.step(step_fn, is_async=(mode != "sync"))
        scaler.update(is_async=(mode != "async+sync_update"))
    model.synchronize()
    return scales, [p.detach().clone() for p in model.model.parameters()]


def _scaled_torch():
    data = make_data(len(PATTERN))
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", 2.0**10, growth_interval=2)
    scales = []
    for (x, y), fault in zip(data, PATTERN):
        scales.append(scaler.get_scale())
        scaler.scale(loss_of(net(x), y)).backward()
        if fault:
            next(net.parameters()).grad.view(-1)[0] = float(fault)
        scaler.step(opt)
        opt.zero_grad()
        scaler.update()
    return scales, [p.detach().clone() for p in net.parameters()]


def test_sync_steps_with_grad_scaler_give_torchs_sequence_and_bits():
    ours, theirs = _scaled_roundpipe("sync"), _scaled_torch()
    assert ours[0] == theirs[0]
    assert _bitwise(ours[1], theirs[1])


def test_async_steps_with_grad_scaler_give_the_one_iteration_lag():
    scales, _ = _scaled_roundpipe("async")
    found = [bool(f) for f in PATTERN]
    lagged_after = reference_scales(2.0**10, found, interval=2, lag=1)
    assert scales == [2.0**10] + lagged_after[:-1]


def test_async_steps_with_sync_update_give_torchs_sequence():
    scales, _ = _scaled_roundpipe("async+sync_update")
    assert scales == _scaled_torch()[0]


# -------------------------------------------------------------------- microbatches
class KwNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(6, 3)

    def forward(self, x, mask=None, bias=None):
        out = self.lin(x)
        if mask is not None:
            out = out * mask
        if bias is not None:
            out = out + bias.sum()
        return out


@pytest.mark.parametrize("batch, micro", [(12, 4), (10, 4), (10, 3), (3, 8)])
def test_microbatches_sum_to_the_full_batch(batch, micro):
    x, y = make_data(1, batch=batch)[0]
    mask = (torch.arange(batch) % 3 != 0).float().unsqueeze(1)  # dim 0 == batch: split
    bias = torch.randn(7)  # dim 0 != batch: given whole to every microbatch

    def sum_loss(o, t):
        return F.mse_loss(o, t, reduction="sum")

    full = RoundPipe(KwNet())
    full_loss = full.forward_backward((x,), {"mask": mask, "bias": bias}, y, sum_loss)
    micro_model = RoundPipe(KwNet(), model_run_config=RoundPipeRunConfig(num_microbatch=micro))
    loss, out = micro_model.forward_backward((x,), {"mask": mask, "bias": bias}, y, sum_loss, return_outputs=True)
    torch.testing.assert_close(loss, full_loss, rtol=1e-5, atol=1e-5)  # summation order differs
    for a, b in zip(micro_model.model.parameters(), full.model.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, KwNet()(x, mask=mask, bias=bias))
    assert not out.requires_grad


def test_one_microbatch_is_a_plain_call_bitwise():
    x, y = make_data(1)[0]
    net = make_net()
    ref = loss_of(net(x), y)
    model = RoundPipe(make_net())
    assert torch.equal(model.forward_backward((x,), label=y, loss_fn=loss_of), ref.detach())


@pytest.mark.parametrize("micro", [1, 2])
def test_the_returned_loss_is_a_copy_that_keeps_the_sign_of_a_zero_loss(micro):
    # The sum starts from the first microbatch's loss, not from zero (0 + -0.0 gives +0.0):
    # one microbatch returns exactly what loss_fn returned, as the plain loop's loss.item()
    # prints it, in memory of its own.
    x, y = make_data(1)[0]
    kept = []

    def negative_zero_loss(out, _):
        kept.append(-(out.sum() * 0).abs())
        return kept[-1]

    model = RoundPipe(make_net(), model_run_config=RoundPipeRunConfig(num_microbatch=micro))
    loss = model.forward_backward((x,), label=y, loss_fn=negative_zero_loss)
    assert loss.item() == 0 and bool(loss.signbit())
    assert all(loss.untyped_storage().data_ptr() != k.untyped_storage().data_ptr() for k in kept)


def test_label_batch_mismatch_is_an_error_not_a_silent_misalignment():
    x, y = make_data(1, batch=10)[0]
    model = RoundPipe(make_net(), model_run_config=RoundPipeRunConfig(num_microbatch=2))
    with pytest.raises(ValueError, match="batch size 5 does not match"):
        model.forward_backward((x,), label=y[:5], loss_fn=loss_of)


def test_custom_split_and_merge_functions_are_honoured():
    x, y = make_data(1, batch=8)[0]
    calls = []

    def split_input(args, kwargs, n):
        calls.append(n)
        return [(args[0][:6],), (args[0][6:],)], [{}, {}]

    config = RoundPipeRunConfig(
        num_microbatch=4,
        split_input=split_input,
        split_label=lambda label, n: [label[:6], label[6:]],
        merge_output=lambda outs: [o.shape[0] for o in outs],
    )
    model = RoundPipe(make_net(), model_run_config=config)
    loss, sizes = model.forward_backward((x,), label=y, loss_fn=loss_of, return_outputs=True)
    assert calls == [4] and sizes == [6, 2]
    assert list(model(x, roundpipe_run_config=RoundPipeRunConfig(merge_output=False)).__class__.__mro__)[0] is list


def test_forward_merges_microbatch_outputs_and_runs_inference_under_no_grad():
    x, _ = make_data(1, batch=10)[0]
    model = RoundPipe(make_net(), model_run_config=RoundPipeRunConfig(num_microbatch=3))
    with torch.no_grad():
        out = model(x)
    assert not out.requires_grad
    torch.testing.assert_close(out, make_net()(x))


def test_sequence_loss_returns_a_list_of_sums():
    x, y = make_data(1)[0]
    model = RoundPipe(make_net())
    losses = model.forward_backward((x,), label=y, loss_fn=lambda o, t: [loss_of(o, t), o.abs().mean()])
    assert isinstance(losses, list) and len(losses) == 2


def test_autocast_around_forward_backward_applies_to_the_model():
    x, y = make_data(1)[0]
    model = RoundPipe(make_net())
    dtypes = []
    model.model.register_forward_hook(lambda m, a, out: dtypes.append(out.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
    assert dtypes == [torch.bfloat16]


# ----------------------------------------------------- gradients, checkpoints, faults
def test_synchronize_loses_no_gradient_and_does_not_double_it():
    data = make_data(3)
    ref_losses, ref_params = plain_loop(make_net(), OPTIMIZERS["sgd_momentum"], data)
    model = RoundPipe(make_net())
    opt = OPTIMIZERS["sgd_momentum"](model.optim_parameters())
    for x, y in data:
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.synchronize()
        model.synchronize()
        grads = [p.grad.clone() for p in model.model.parameters()]
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
    assert _bitwise([p.detach() for p in model.model.parameters()], ref_params)
    assert all(g is not None for g in grads)


def test_gradient_accumulation_over_several_calls():
    data = make_data(4)
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for x, y in data:
        loss_of(net(x), y).backward()
    opt.step()
    model = RoundPipe(make_net())
    ropt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    for x, y in data:
        model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(ropt.step, is_async=False)
    assert _bitwise(list(model.model.parameters()), list(net.parameters()))


def test_loading_weights_refreshes_the_optimizer_copies():
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.0)
    x, y = make_data(1)[0]
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(lambda: (opt.step(), opt.zero_grad()))
    state = {k: torch.full_like(v, 7.0) for k, v in model.model.state_dict().items()}
    model.model.load_state_dict(state)
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(lambda: (opt.step(), opt.zero_grad()))  # upstream would restore the old weights here
    model.synchronize()
    assert all(torch.all(p == 7.0) for p in model.model.parameters())
    assert all(torch.all(c == 7.0) for c in model.optim_parameters())
    model.load_state_dict({f"model.{k}": torch.full_like(v, 3.0) for k, v in state.items()}, assign=True)
    model.synchronize()
    assert all(torch.all(c == 3.0) for c in model.optim_parameters())


def _boom():
    raise ValueError("bad step")


@pytest.mark.parametrize("where", ["step", "synchronize", "update"])
def test_step_function_errors_reach_the_main_thread(where):
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = GradScaler()
    x, y = make_data(1)[0]
    model.forward_backward((x,), label=y, loss_fn=lambda o, t: scaler.scale(loss_of(o, t)))
    model.step(_boom)
    scaler.update()  # lagged: does not wait for this iteration
    model.forward_backward((x,), label=y, loss_fn=lambda o, t: scaler.scale(loss_of(o, t)))
    with pytest.raises(ValueError, match="bad step") as caught:
        if where == "step":
            model.step(lambda: (scaler.step(opt), opt.zero_grad()))
        elif where == "synchronize":
            model.synchronize()
        else:
            scaler.update()  # waits for the previous iteration's step function
    assert "_boom" in "".join(traceback.format_tb(caught.value.__traceback__))
    # Nothing hangs and training goes on. The step() that raised queued this iteration's
    # own step (its gradients left the model: None, or a buffer handed back zeroed); after
    # synchronize/update they are still there.
    assert all((p.grad is None or not p.grad.any()) == (where == "step") for p in model.model.parameters())
    if where == "step":
        scaler.update()
        model.forward_backward((x,), label=y, loss_fn=lambda o, t: scaler.scale(loss_of(o, t)))
    model.step(lambda: (scaler.step(opt), opt.zero_grad()), is_async=False)


def test_interrupting_a_wait_keeps_the_gradients():
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    x, y = make_data(1)[0]
    gate = threading.Event()
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(lambda: gate.wait(10))
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    grads = [p.grad.clone() for p in model.model.parameters()]
    threading.Timer(0.2, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt) as caught:
        model.step(lambda: opt.step())
    assert "previous step function" in "\n".join(caught.value.__notes__)
    assert _bitwise([p.grad for p in model.model.parameters()], grads)
    gate.set()
    model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)


def test_non_scalar_loss_error_keeps_earlier_microbatch_gradients():
    x, y = make_data(1, batch=8)[0]
    model = RoundPipe(make_net(), model_run_config=RoundPipeRunConfig(num_microbatch=2))
    ref = RoundPipe(make_net())
    ref.forward_backward((x[:4],), label=y[:4], loss_fn=loss_of)
    calls = []

    def second_is_bad(out, label):
        calls.append(1)
        return loss_of(out, label) if len(calls) == 1 else out

    with pytest.raises(ValueError, match="scalar"):
        model.forward_backward((x,), label=y, loss_fn=second_is_bad)
    assert _bitwise([p.grad for p in model.model.parameters()], [p.grad for p in ref.model.parameters()])


def test_backward_runs_outside_the_callers_autocast():
    class Probe(torch.autograd.Function):
        seen = []

        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            Probe.seen.append(torch.is_autocast_enabled("cpu"))
            return grad

    model = RoundPipe(make_net())
    x, y = make_data(1)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model.forward_backward((x,), label=y, loss_fn=lambda o, t: loss_of(Probe.apply(o), t))
    assert Probe.seen == [False]


@pytest.mark.parametrize("is_async", [False, True])
def test_gradient_buffers_come_back_zeroed_and_the_next_backward_stores_its_own(is_async):
    # After a step the model holds its zeroed gradient buffers; the next backward does not
    # add into them (0 + g, a second pass over the memory) but stores the gradient it
    # computed, as after torch's zero_grad(): the buffers are freed before it runs.
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    for k, (x, y) in enumerate(make_data(6)):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
        if k >= 1 or not is_async:  # async: the previous step's buffers come back
            grads = [p.grad for p in model.model.parameters()]
            assert all(g is not None and torch.count_nonzero(g) == 0 for g in grads)
            buffers = [weakref.ref(g) for g in grads]
            del grads  # a reference kept here would (rightly) keep the buffer in use
            model.forward_backward((x,), label=y, loss_fn=loss_of)
            assert all(b() is None for b in buffers)  # freed: the backward stored new tensors
            model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
    model.synchronize()


class _TwoDtypes(torch.nn.Module):
    """A float64 layer feeding a float32 one: gradient buffers of two dtypes."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.first = torch.nn.Linear(6, 8).double()
        self.second = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.tanh(self.first(x.double())).float())


@pytest.mark.parametrize("is_async", [False, True])
def test_gradient_buffers_of_two_dtypes_come_back_zeroed_and_train_as_the_plain_loop(is_async):
    # The buffers a step lets go of are zeroed together (one foreach call over dtypes):
    # each comes back as a zero tensor of its parameter's dtype, and synchronous training
    # matches the plain loop bit for bit.
    data = make_data(5)
    model = RoundPipe(_TwoDtypes())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1, momentum=0.9)
    ref_net = _TwoDtypes()
    ref_opt = torch.optim.SGD(ref_net.parameters(), lr=0.1, momentum=0.9)
    for k, (x, y) in enumerate(data):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
        if k >= 1 or not is_async:  # async: the previous step's buffers come back
            for param in model.model.parameters():
                assert param.grad is not None and param.grad.dtype == param.dtype
                assert torch.count_nonzero(param.grad) == 0
        loss_of(ref_net(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    model.synchronize()
    if not is_async:
        assert _bitwise(list(model.model.parameters()), list(ref_net.parameters()))


def _signed_zero_gradient_loops(make_step):
    """A weight whose gradient is -0.0 in one place, trained by RoundPipe and by torch."""
    torch.manual_seed(0)
    net = torch.nn.Linear(2, 1, bias=False)
    ref = torch.nn.Linear(2, 1, bias=False)
    ref.load_state_dict(net.state_dict())
    x = torch.tensor([[0.0, 1.0]])  # d(-out)/dw = -x = [-0.0, -1.0]
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    return model, make_step(opt), ref, torch.optim.SGD(ref.parameters(), lr=0.1), x


@pytest.mark.parametrize("is_async", [False, True])
def test_the_next_backward_keeps_the_sign_of_a_zero_gradient_as_the_plain_loop(is_async):
    model, step_fn, ref, ref_opt, x = _signed_zero_gradient_loops(lambda opt: lambda: (opt.step(), opt.zero_grad()))
    for _ in range(3):
        model.forward_backward((x,), loss_fn=lambda out, _: -out.sum())
        (-ref(x).sum()).backward()
        grad, ref_grad = model.model.weight.grad, ref.weight.grad
        assert torch.equal(grad, ref_grad) and torch.equal(grad.signbit(), ref_grad.signbit())
        del grad
        model.step(step_fn, is_async=is_async)
        ref_opt.step()
        ref_opt.zero_grad()
    model.synchronize()


def test_a_gradient_buffer_the_user_holds_after_a_sync_step_receives_the_next_gradient():
    # ``g = p.grad`` read after a step aliases the model's gradient, as after torch's
    # zero_grad(set_to_none=False): the next backward adds into that same tensor.
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    (x, y), (x2, y2) = make_data(2)
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
    held = [p.grad for p in model.model.parameters()]
    views = [p.grad.view(-1) for p in model.model.parameters()]  # memory shared, not the tensor
    model.forward_backward((x2,), label=y2, loss_fn=loss_of)
    grads = [p.grad for p in model.model.parameters()]
    assert all(g is h for g, h in zip(grads, held))
    assert all(torch.count_nonzero(g) > 0 for g in grads)
    assert _bitwise([v.view_as(g) for v, g in zip(views, grads)], grads)


def test_writes_to_param_grad_between_sync_steps_reach_the_next_step_as_in_the_plain_loop():
    # The user adds to the zeroed buffer after a step: the next
    # backward adds its gradient to that, exactly as in a loop with zero_grad(set_to_none=False).
    net, ref = make_net(), make_net()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    data = make_data(5)
    for k, (x, y) in enumerate(data):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
        loss_of(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad(set_to_none=False)
        assert _bitwise([p.detach() for p in net.parameters()], [p.detach() for p in ref.parameters()])
        with torch.no_grad():
            for p, r in zip(net.parameters(), ref.parameters()):
                p.grad.add_(0.5 * k)
                r.grad.add_(0.5 * k)
    assert _bitwise([p.detach() for p in net.parameters()], [p.detach() for p in ref.parameters()])


def test_a_parameter_the_next_backward_skips_keeps_a_zero_gradient():
    net = _TwoBranches()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    (x, y), (x2, y2) = make_data(2)
    net.use_b = True
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
    net.use_b = False
    model.forward_backward((x2,), label=y2, loss_fn=loss_of)
    assert all(p.grad is not None and torch.count_nonzero(p.grad) == 0 for p in net.b.parameters())
    assert all(torch.count_nonzero(p.grad) > 0 for p in net.a.parameters())


@pytest.mark.parametrize("is_async", [False, True])
def test_gradient_buffers_are_zeroed_by_the_thread_that_ran_the_step(is_async, monkeypatch):
    # Asynchronous steps zero the buffers they let go of on the optimizer thread, so the
    # memset overlaps the next forward instead of running inside the main thread's step().
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    buffers, zeroed_on = set(), []
    real_zero, real_foreach_zero = torch.Tensor.zero_, torch._foreach_zero_

    def record(tensors):
        if any(tensor.data_ptr() in buffers for tensor in tensors):
            zeroed_on.append(threading.current_thread().name)

    def zero_(tensor):
        record([tensor])
        return real_zero(tensor)

    def foreach_zero_(tensors):
        record(tensors)
        return real_foreach_zero(tensors)

    monkeypatch.setattr(torch.Tensor, "zero_", zero_)
    monkeypatch.setattr(torch, "_foreach_zero_", foreach_zero_)
    for x, y in make_data(4):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        buffers.update(p.grad.data_ptr() for p in model.model.parameters())
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
    model.synchronize()
    step_thread = roundpipe.optim_stream.THREAD_NAME if is_async else threading.current_thread().name
    assert zeroed_on and set(zeroed_on) == {step_thread}


@pytest.mark.parametrize("is_async", [False, True])
def test_the_buffers_of_a_failed_step_are_not_handed_back(is_async):
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    (x, y), (x2, y2) = make_data(2)
    model.forward_backward((x,), label=y, loss_fn=loss_of)

    def failing_step():
        opt.zero_grad()  # lets go of every buffer, then fails
        raise ValueError("step failed")

    with pytest.raises(ValueError, match="step failed"):
        model.step(failing_step, is_async=is_async)
        model.forward_backward((x2,), label=y2, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)  # raises the failure
    assert all(p.grad is None for p in model.model.parameters())


def test_a_gradient_the_step_function_keeps_is_not_handed_back():
    model = RoundPipe(make_net())
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    kept = []
    x, y = make_data(1)[0]
    model.forward_backward((x,), label=y, loss_fn=loss_of)
    expected = [p.grad.clone() for p in model.model.parameters()]

    def step_fn():
        for c in model.optim_parameters():  # aliases of the memory, not the tensors
            g = c.grad
            kept.append(torch.empty(0).set_(g.untyped_storage(), 0, (g.numel(),), (1,)))
            del g
        opt.step()
        opt.zero_grad()

    model.step(step_fn, is_async=False)
    assert all(p.grad is None for p in model.model.parameters())
    assert _bitwise([k.view_as(e) for k, e in zip(kept, expected)], expected)


class _TwoBranches(torch.nn.Module):
    """Uses branch ``a``, or ``b`` when ``use_b`` is set: the other gets no gradient."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)
        self.use_b = False

    def forward(self, x):
        return self.b(x) if self.use_b else self.a(x)


@pytest.mark.parametrize("is_async", [False, True])
def test_a_branch_that_gets_no_gradient_is_not_stepped_after_buffers_come_back(is_async):
    net = _TwoBranches()
    model = RoundPipe(net)
    opt = torch.optim.Adam(model.optim_parameters(), lr=0.1)
    copies = dict(model.optim_named_parameters())
    b_copies = [c for name, c in copies.items() if ".b." in name]
    initial = [c.detach().clone() for c in b_copies]
    for x, y in make_data(4):
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=is_async)
    model.synchronize()
    assert all(c not in opt.state for c in b_copies)  # Adam never saw a gradient for b
    assert _bitwise([c.detach() for c in b_copies], initial)


def test_a_branch_used_once_steps_exactly_as_in_the_plain_loop():
    data = make_data(4)
    net, ref = _TwoBranches(), _TwoBranches()
    model = RoundPipe(net)
    opt = torch.optim.Adam(model.optim_parameters(), lr=0.1)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
    for k, (x, y) in enumerate(data):
        net.use_b = ref.use_b = k == 1
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
        loss_of(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert _bitwise([p.detach() for p in net.parameters()], [p.detach() for p in ref.parameters()])


class _SometimesHead(torch.nn.Module):
    """A trunk and a head, plus a second head used only while ``use_c`` is set."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.c = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3), torch.nn.Linear(8, 3)
        self.use_c = False

    def forward(self, x):
        h = torch.tanh(self.a(x))
        return self.b(h) + self.c(h) if self.use_c else self.b(h)


def _sometimes_head_reference(make_opt, data, staleness, set_to_none, clip):
    """Plain torch, with the optimizer on separate fp32 masters so that it can step with
    ``staleness`` 0 or 1; the head ``c`` is used in iterations 1 and 4 only. A master gets
    a gradient exactly when the backward gave its parameter one (None stays None)."""
    net = _SometimesHead()
    masters = [torch.nn.Parameter(p.detach().clone()) for p in net.parameters()]
    opt = make_opt(masters)
    history = [[m.detach().clone() for m in masters]]
    for k, (x, y) in enumerate(data):
        with torch.no_grad():
            for p, w in zip(net.parameters(), history[max(0, k - staleness)]):
                p.copy_(w)
        net.use_c = k % 3 == 1
        loss_of(net(x), y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        for p, m in zip(net.parameters(), masters):
            if p.grad is not None:
                m.grad = p.grad.clone() if m.grad is None else m.grad.add_(p.grad)
            p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        history.append([m.detach().clone() for m in masters])
    return history[-1]


@pytest.mark.parametrize("clip", [False, True])
@pytest.mark.parametrize("set_to_none", [True, False])
@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("is_async", [False, True])
def test_a_parameter_without_a_gradient_is_stepped_as_in_the_plain_loop(is_async, name, set_to_none, clip):
    # The head c gets a gradient in iterations 1 and 4 only. Where the plain loop leaves its
    # grad None, the optimizer skips it (Adam and momentum would move it with a zero
    # gradient), also after clip_grad_norm_ over all the model's gradients wrote into the
    # zero buffers handed back to the model.
    data = make_data(6)
    expected = _sometimes_head_reference(OPTIMIZERS[name], data, int(is_async), set_to_none, clip)
    net = _SometimesHead()
    model = RoundPipe(net)
    opt = OPTIMIZERS[name](model.optim_parameters())
    for k, (x, y) in enumerate(data):
        net.use_c = k % 3 == 1
        model.forward_backward((x,), label=y, loss_fn=loss_of)
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        model.step(lambda: (opt.step(), opt.zero_grad(set_to_none=set_to_none)), is_async=is_async)
    model.synchronize()
    assert _bitwise([p.detach() for p in net.parameters()], expected)


def test_a_sparse_gradient_steps_as_in_the_plain_loop():
    # A sparse gradient (nn.Embedding(sparse=True)) has no storage to inspect: it is never
    # handed back, and the step is the plain loop's.
    def make():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))

    tokens, target = torch.tensor([[1, 2], [3, 1]]), torch.randn(2, 2, 2)
    net, ref = make(), make()
    model = RoundPipe(net)
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for _ in range(3):
        model.forward_backward((tokens,), label=target, loss_fn=loss_of)
        model.step(lambda: (opt.step(), opt.zero_grad()), is_async=False)
        loss_of(ref(tokens), target).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    assert _bitwise([p.detach() for p in net.parameters()], [p.detach() for p in ref.parameters()])
