"""RoundPipe's autograd training form against plain torch loops.

The form (design/MIGRATE.md, "Two target forms"): ``out = model(x)`` on the wrapped model,
the loss code as written, ``scaler.scale(loss).backward()``, ``model.step(step_fn)`` with only
the optimizer work in ``step_fn``, then ``scaler.update()``. With ``model.step(fn,
is_async=False)`` and ``scaler.update(is_async=False)`` it must reproduce the torch loop with
``torch.amp.GradScaler`` bit for bit: losses, scales, grad norms and every weight. The
asynchronous default must run the same steps and match the staleness-1 reference.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import List, Optional, Sequence

import pytest
import torch
import torch.nn.functional as F

from roundpipe import GradScaler, RoundPipe, RoundPipeRunConfig
from runtime_refs import loss_of, make_data, make_net, master_weight_loop
from scaler_loops import inject, reference_scales

OPTIMIZERS = {
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
}
INIT_SCALE = 2.0**10


@dataclasses.dataclass(frozen=True)
class Setup:
    """One training configuration, run by both loops."""

    optimizer: str = "sgd_momentum"
    autocast: Optional[torch.dtype] = None  # CPU autocast dtype; None trains in fp32
    clip: float = 0.0  # clip_grad_norm_ after unscale_ when > 0
    faults: Sequence = (0,) * 6  # per optimizer step: 0, "inf" or "nan" written into a grad
    accumulation: int = 1  # backward calls per optimizer step (loss divided by it)
    num_microbatch: int = 1  # RoundPipe run config; the reference forwards chunk by chunk


@dataclasses.dataclass
class Trace:
    losses: List[float] = dataclasses.field(default_factory=list)
    scales: List[float] = dataclasses.field(default_factory=list)
    norms: List[float] = dataclasses.field(default_factory=list)
    stepped: List[int] = dataclasses.field(default_factory=list)  # iterations whose step ran
    params: List[torch.Tensor] = dataclasses.field(default_factory=list)

    def count_steps(self, optimizer: torch.optim.Optimizer) -> None:
        """Record the iteration of every optimizer step that really ran (not skipped)."""
        optimizer.register_step_post_hook(lambda *_: self.stepped.append(len(self.scales)))


def _autocast(setup: Setup):
    return torch.autocast("cpu", dtype=setup.autocast or torch.bfloat16, enabled=setup.autocast is not None)


def _chunked_forward(net: torch.nn.Module, x: torch.Tensor, pieces: int) -> torch.Tensor:
    """What RoundPipe's forward computes with ``pieces`` microbatches, in plain torch."""
    if pieces == 1:
        return net(x)
    return torch.cat([net(chunk) for chunk in torch.tensor_split(x, pieces)])


def _micro_steps(setup: Setup):
    data = make_data(len(setup.faults) * setup.accumulation)
    for k, fault in enumerate(setup.faults):
        yield fault, data[k * setup.accumulation:(k + 1) * setup.accumulation]


def torch_loop(setup: Setup) -> Trace:
    """The program a user starts from: torch's scaler on the model's own parameters."""
    net = make_net()
    opt = OPTIMIZERS[setup.optimizer](net.parameters())
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=2)
    trace = Trace()
    trace.count_steps(opt)
    for fault, micro in _micro_steps(setup):
        for x, y in micro:
            with _autocast(setup):
                loss = loss_of(_chunked_forward(net, x, setup.num_microbatch), y) / setup.accumulation
            scaler.scale(loss).backward()
            trace.losses.append(loss.item())
        inject(net, fault)
        if setup.clip:
            scaler.unscale_(opt)
            trace.norms.append(torch.nn.utils.clip_grad_norm_(net.parameters(), setup.clip).item())
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        trace.scales.append(scaler.get_scale())
    trace.params = [p.detach().clone() for p in net.parameters()]
    return trace


def autograd_form(setup: Setup, is_async: bool = False, sync_update: bool = True) -> Trace:
    """The same program in RoundPipe's autograd form: only the wrap, the optimizer's
    parameters and the optimizer work (moved into the step function) differ."""
    model = RoundPipe(make_net(), model_run_config=RoundPipeRunConfig(num_microbatch=setup.num_microbatch))
    opt = OPTIMIZERS[setup.optimizer](model.optim_parameters())
    scaler = GradScaler(init_scale=INIT_SCALE, growth_interval=2)
    trace = Trace()
    trace.count_steps(opt)

    def step_fn():
        if setup.clip:
            scaler.unscale_(opt)
            trace.norms.append(torch.nn.utils.clip_grad_norm_(model.optim_parameters(), setup.clip).item())
        scaler.step(opt)
        opt.zero_grad()

    for fault, micro in _micro_steps(setup):
        for x, y in micro:
            with _autocast(setup):
                loss = loss_of(model(x), y) / setup.accumulation
            scaler.scale(loss).backward()
            trace.losses.append(loss.item())
        inject(model.model, fault)
        model.step(step_fn, is_async=is_async)
        scaler.update(is_async=not sync_update)
        trace.scales.append(scaler.get_scale())
    model.synchronize()
    trace.params = [p.detach().clone() for p in model.model.parameters()]
    return trace


def _assert_same(ours: Trace, theirs: Trace) -> None:
    assert ours.losses == theirs.losses
    assert ours.scales == theirs.scales
    assert ours.norms == theirs.norms
    assert ours.stepped == theirs.stepped
    assert len(ours.params) == len(theirs.params)
    assert all(torch.equal(a, b) for a, b in zip(ours.params, theirs.params))


SETUPS = {
    "sgd_fp32": Setup(),
    "adamw_fp32": Setup(optimizer="adamw"),
    "sgd_bf16": Setup(autocast=torch.bfloat16),
    "adamw_bf16": Setup(optimizer="adamw", autocast=torch.bfloat16),
    "clip_after_unscale": Setup(optimizer="adamw", autocast=torch.bfloat16, clip=0.3),
    "overflow_steps": Setup(faults=(0, "inf", 0, 0, "nan", 0, 0)),
    "overflow_with_clip": Setup(optimizer="adamw", clip=0.3, faults=(0, 0, "inf", 0, 0)),
    "accumulate_two": Setup(optimizer="adamw", autocast=torch.bfloat16, accumulation=2),
    "accumulate_with_overflow": Setup(accumulation=2, faults=(0, "inf", 0, 0, 0)),
    "three_microbatches": Setup(optimizer="adamw", autocast=torch.bfloat16, num_microbatch=3),
    "microbatches_accumulate_clip": Setup(num_microbatch=2, accumulation=2, clip=0.3),
}


@pytest.mark.parametrize("name", SETUPS)
def test_exact_autograd_form_matches_the_torch_loop_bitwise(name):
    setup = SETUPS[name]
    reference = torch_loop(setup)
    assert len(reference.scales) == len(setup.faults)
    _assert_same(autograd_form(setup), reference)


def test_the_reference_sees_the_overflows_it_is_given():
    """Guard on the harness: injected faults back the scale off, as torch's rule says."""
    setup = SETUPS["overflow_steps"]
    found = [bool(f) for f in setup.faults]
    assert torch_loop(setup).scales == reference_scales(INIT_SCALE, found, interval=2)


def test_microbatches_only_regroup_the_forward():
    """Three microbatches give the full-batch numbers up to summation order."""
    whole = torch_loop(Setup(optimizer="adamw"))
    split = autograd_form(Setup(optimizer="adamw", num_microbatch=3))
    assert split.losses == pytest.approx(whole.losses, rel=1e-5)
    for a, b in zip(split.params, whole.params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_async_steps_with_sync_update_run_every_step_with_torchs_scales():
    setup = Setup(optimizer="adamw", faults=(0, "inf", 0, 0, 0, 0))
    ours, theirs = autograd_form(setup, is_async=True), torch_loop(setup)
    assert len(ours.losses) == len(setup.faults)
    # get_scale() after update(is_async=False) waits for the step, so the indices are exact.
    assert ours.stepped == theirs.stepped == [0, 2, 3, 4, 5]  # the overflowed step is skipped
    assert ours.scales == theirs.scales


def test_async_steps_with_async_update_give_the_one_iteration_lag():
    setup = Setup(faults=(0, 0, "inf", 0, 0, 0, 0))
    ours = autograd_form(setup, is_async=True, sync_update=False)
    found = [bool(f) for f in setup.faults]
    lagged = reference_scales(INIT_SCALE, found, interval=2, lag=1)
    # update() k returns before iteration k's step; get_scale() shows the scale of k+1.
    assert ours.scales == lagged


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", OPTIMIZERS)
def test_async_autograd_form_matches_the_staleness_one_reference(name, dtype):
    data = make_data(7)
    ref_losses, ref_used, ref_final = master_weight_loop(
        make_net(dtype), OPTIMIZERS[name], data, staleness=1, input_dtype=dtype
    )
    net = make_net(dtype)
    used = []
    net.register_forward_pre_hook(lambda m, a: used.append([p.detach().clone() for p in m.parameters()]))
    model = RoundPipe(net, optim_dtype=torch.float32)
    opt = OPTIMIZERS[name](model.optim_parameters())
    losses = []
    for x, y in data:
        loss = loss_of(model(x.to(dtype)), y)
        loss.backward()
        model.step(lambda: (opt.step(), opt.zero_grad()))
        losses.append(loss.item())
    model.synchronize()
    assert losses == ref_losses
    assert len(used) == len(ref_used)
    assert all(torch.equal(a, b) for step_a, step_b in zip(used, ref_used) for a, b in zip(step_a, step_b))
    assert all(torch.equal(c, m) for c, m in zip(model.optim_parameters(), ref_final))


def test_synchronize_between_backward_and_step_keeps_the_gradients():
    """Inspecting grads after a plain backward (synchronize, twice) changes nothing."""
    setup = Setup(optimizer="adamw", faults=(0, 0, 0))
    reference = torch_loop(setup)
    model = RoundPipe(make_net())
    opt = OPTIMIZERS["adamw"](model.optim_parameters())
    scaler = GradScaler(init_scale=INIT_SCALE, growth_interval=2)
    for _, micro in _micro_steps(setup):
        (x, y), = micro
        scaler.scale(loss_of(model(x), y)).backward()
        model.synchronize()
        model.synchronize()
        assert all(p.grad is not None for p in model.model.parameters())
        model.step(lambda: (scaler.step(opt), opt.zero_grad()), is_async=False)
        scaler.update(is_async=False)
    assert all(torch.equal(a, b) for a, b in zip(model.model.parameters(), reference.params))


# -------------------------------------------------------------------------------- GANs
def _generator() -> torch.nn.Module:
    torch.manual_seed(10)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))


def _discriminator() -> torch.nn.Module:
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LeakyReLU(0.2), torch.nn.Linear(8, 1))


def _gan_batches(steps: int):
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 6, generator=gen), torch.randn(8, 4, generator=gen)) for _ in range(steps)]


GAN_FAULTS = (0, 0, "inf", 0, 0, 0)  # written into a generator grad before its step


def _bce(logits: torch.Tensor, target: float) -> torch.Tensor:
    return F.binary_cross_entropy_with_logits(logits.float(), torch.full_like(logits.float(), target))


def _adam(params):
    return torch.optim.Adam(params, lr=2e-3, betas=(0.5, 0.999))


def gan_loop(shared: bool, wrapped: bool):
    """DCGAN-style loop: D on real and detached fake, then G through D; grads zeroed on the
    modules at the top of each update, as the DCGAN example does. ``wrapped=False`` is the
    plain torch program; ``wrapped=True`` the same program with each network a RoundPipe
    stepped on its own (its step function also zeroes the copies' grads)."""
    make_scaler = GradScaler if wrapped else functools.partial(torch.amp.GradScaler, "cpu")
    netG, netD = _generator(), _discriminator()
    if wrapped:
        netG, netD = RoundPipe(netG), RoundPipe(netD)
        optG, optD = _adam(netG.optim_parameters()), _adam(netD.optim_parameters())
    else:
        optG, optD = _adam(netG.parameters()), _adam(netD.parameters())
    scalerD = make_scaler(init_scale=INIT_SCALE, growth_interval=2)
    scalerG = scalerD if shared else make_scaler(init_scale=2.0**8, growth_interval=3)
    scalers = list({id(s): s for s in (scalerD, scalerG)}.values())

    def step(net, opt, scaler):
        if not wrapped:
            scaler.step(opt)
            return
        net.step(lambda: (scaler.step(opt), opt.zero_grad()), is_async=False)

    losses = []
    for (real, noise), fault in zip(_gan_batches(len(GAN_FAULTS)), GAN_FAULTS):
        netD.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            fake = netG(noise)
            errD = _bce(netD(real), 1.0) + _bce(netD(fake.detach()), 0.0)
        scalerD.scale(errD).backward()
        step(netD, optD, scalerD)
        netG.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            errG = _bce(netD(fake), 1.0)
        scalerG.scale(errG).backward()
        inject(netG, fault)
        step(netG, optG, scalerG)
        for scaler in scalers:
            scaler.update(**({"is_async": False} if wrapped else {}))
        losses.append((errD.item(), errG.item(), scalerD.get_scale(), scalerG.get_scale()))
    return losses, [p.detach().clone() for net in (netG, netD) for p in net.parameters()]


@pytest.mark.parametrize("shared", [True, False], ids=["one_scaler", "two_scalers"])
def test_gan_with_two_wrapped_models_matches_torch_bitwise(shared):
    ref_losses, ref_params = gan_loop(shared, wrapped=False)
    losses, params = gan_loop(shared, wrapped=True)
    assert losses == ref_losses
    fault = GAN_FAULTS.index("inf")
    assert ref_losses[fault][3] == ref_losses[fault - 1][3] / 2  # the overflow backed G's scale off
    assert all(torch.equal(a, b) for a, b in zip(params, ref_params))


def test_discriminator_grads_from_the_generator_loss_are_dropped_by_zero_grad():
    """The generator's backward also reaches D; ``netD.zero_grad()`` on the wrapper must clear
    those pending grads (else D's next step would apply them), as on a plain module."""
    netD = RoundPipe(_discriminator())
    optD = torch.optim.SGD(netD.optim_parameters(), lr=1.0)
    real, _ = _gan_batches(1)[0]
    _bce(netD(real), 1.0).backward()
    netD.zero_grad()
    assert all(p.grad is None for p in netD.model.parameters())
    before = [c.detach().clone() for c in netD.optim_parameters()]
    netD.step(optD.step, is_async=False)
    assert all(torch.equal(a, b) for a, b in zip(netD.optim_parameters(), before))
