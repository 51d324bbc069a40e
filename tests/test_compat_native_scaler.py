"""roundpipe.compat.NativeScaler, the drop-in for timm's NativeScaler: with ``is_async=False``
a RoundPipe loop reproduces the plain torch loop with timm's wrapper bit for bit (weights
and scale, also across an overflow and accumulation steps); asynchronously it runs the same
steps; bad arguments fail before any work."""

import copy

import pytest
import torch

import roundpipe
from roundpipe.compat import NativeScaler


class TimmNativeScaler:
    """timm's NativeScaler as timm writes it (on torch's GradScaler), the reference."""

    state_dict_key = "amp_scaler"

    def __init__(self, device="cpu"):
        self._scaler = torch.amp.GradScaler(device)

    def __call__(self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, need_update=True):
        self._scaler.scale(loss).backward()
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                if clip_mode == "norm":
                    torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
                else:
                    torch.nn.utils.clip_grad_value_(parameters, clip_grad)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def _batches():
    gen = torch.Generator().manual_seed(4)
    batches = [(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(10)]
    batches[4][0][0, 0] = float("inf")  # one overflowing iteration: its step is skipped
    return batches


def _train(model, scaler, optimizer, parameters, clip_mode):
    scales = []
    for it, (x, y) in enumerate(_batches()):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x).float(), y)
        update = it % 2 == 1
        scaler(loss, optimizer, clip_grad=0.3, clip_mode=clip_mode, parameters=parameters(), need_update=update)
        if update:
            optimizer.zero_grad()
            scales.append(scaler.state_dict()["scale"])
    return scales


@pytest.mark.parametrize("clip_mode", ["norm", "value"])
def test_synchronous_drop_in_matches_timms_wrapper_on_torch_bitwise(clip_mode):
    reference = _model()
    optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    timm_scaler = TimmNativeScaler()
    expected = _train(reference, timm_scaler, optimizer, reference.parameters, clip_mode)

    model = roundpipe.RoundPipe(copy.deepcopy(_model()))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=1e-2)
    scaler = NativeScaler("cpu", model=model, is_async=False)
    assert _train(model, scaler, optimizer, model.optim_parameters, clip_mode) == expected
    model.synchronize()
    for got, want in zip(model.model.parameters(), reference.parameters()):
        assert torch.equal(got, want)
    state = scaler.state_dict()
    assert {key: state[key] for key in timm_scaler.state_dict()} == timm_scaler.state_dict()


def test_asynchronous_drop_in_runs_every_step():
    model = roundpipe.RoundPipe(_model())
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = NativeScaler("cpu", model=model)
    steps = []
    for it, (x, y) in enumerate(_batches()):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler(loss, optimizer, parameters=model.optim_parameters())
        model.synchronize()
        optimizer.zero_grad()
        steps.append(it)
    assert len(steps) == 10 and scaler.state_dict_key == "amp_scaler"


def test_drop_in_refuses_what_it_cannot_do_before_any_work():
    with pytest.raises(TypeError, match="RoundPipe model"):
        NativeScaler("cpu", model=_model())
    model = roundpipe.RoundPipe(_model())
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = NativeScaler("cpu", model=model, is_async=False)
    loss = model(torch.randn(2, 6)).sum()
    with pytest.raises(ValueError, match="agc"):
        scaler(loss, optimizer, clip_grad=0.01, clip_mode="agc", parameters=model.optim_parameters())
    assert all(p.grad is None for p in model.model.parameters())  # no backward ran
