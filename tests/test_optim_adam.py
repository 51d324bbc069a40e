"""roundpipe.optim.Adam: upstream's signature, torch's bits."""

import itertools

import pytest
import torch

import roundpipe
from roundpipe import GradScaler
from scaler_loops import train

FLAGS = [
    dict(weight_decay=wd, amsgrad=ams, maximize=mx, decoupled_weight_decay=dec)
    for wd, ams, mx, dec in itertools.product([0.0, 0.1], [False, True], [False, True], [False, True])
]


def _run(cls, device="cpu", **flags):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(n, device=device)) for n in (7, 300, 33)]
    opt = cls(params, lr=1e-2, **flags)
    gen = torch.Generator().manual_seed(1)
    for _ in range(12):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).to(device)
        opt.step()
    return params, opt


@pytest.mark.parametrize("flags", FLAGS, ids=lambda f: "-".join(f"{k}={v}" for k, v in f.items()))
def test_default_adam_is_bitwise_torchs(flags):
    ours, ours_opt = _run(roundpipe.optim.Adam, **flags)
    theirs, _ = _run(torch.optim.Adam, **flags)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
    assert ours_opt.defaults["foreach"] is True  # chosen for speed


@pytest.mark.parametrize("fused", [True, False])
def test_explicit_flags_are_passed_through(fused):
    ours, _ = _run(roundpipe.optim.Adam, fused=fused)
    theirs, _ = _run(torch.optim.Adam, fused=fused)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_fused_adam_works_with_the_grad_scaler_fused_path():
    pattern = [0, "inf", 0, 0, "nan", 0]
    ours = train(
        lambda: GradScaler(256.0, growth_interval=2),
        pattern,
        "job_wait",
        lambda m: [roundpipe.optim.Adam(m.parameters(), lr=0.01, fused=True)],
    )
    theirs = train(
        lambda: torch.amp.GradScaler("cpu", 256.0, growth_interval=2),
        pattern,
        "plain",
        lambda m: [torch.optim.Adam(m.parameters(), lr=0.01, fused=True)],
    )
    assert ours[0] == theirs[0] and ours[1] == theirs[1]
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))


@pytest.mark.cuda
def test_default_adam_is_bitwise_torchs_on_cuda():
    ours, _ = _run(roundpipe.optim.Adam, device="cuda", weight_decay=0.1)
    theirs, _ = _run(torch.optim.Adam, device="cuda", weight_decay=0.1)
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))
