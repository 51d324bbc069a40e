"""The scale-sequence contract: torch's bits in a plain loop, the one-iteration lag when
steps are queued and not waited for, deterministic whatever the thread timing."""

import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roundpipe import GradScaler
from scaler_loops import reference_scales, train

faults = st.lists(st.sampled_from([0, 0, 0, "inf", "nan"]), min_size=1, max_size=14)
HYPOTHESIS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _same_params(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


@HYPOTHESIS
@given(pattern=faults, interval=st.integers(1, 4), log2_init=st.integers(-2, 20))
def test_plain_loop_matches_torch_bitwise(pattern, interval, log2_init):
    init = 2.0**log2_init
    ours = train(lambda: GradScaler(init, growth_interval=interval), pattern)
    theirs = train(lambda: torch.amp.GradScaler("cpu", init, growth_interval=interval), pattern)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert _same_params(ours[2], theirs[2])
    found = [bool(f) for f in pattern]
    assert ours[0] == reference_scales(init, found, interval=interval)


@HYPOTHESIS
@given(pattern=faults, interval=st.integers(1, 4))
def test_steps_on_optimizer_thread_waited_match_torch_bitwise(pattern, interval):
    ours = train(lambda: GradScaler(64.0, growth_interval=interval), pattern, mode="job_wait")
    theirs = train(lambda: torch.amp.GradScaler("cpu", 64.0, growth_interval=interval), pattern)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert _same_params(ours[2], theirs[2])


@HYPOTHESIS
@given(pattern=faults, interval=st.integers(1, 4))
def test_unwaited_steps_follow_the_one_iteration_lag(pattern, interval):
    ours = train(lambda: GradScaler(64.0, growth_interval=interval), pattern, mode="async")
    found = [bool(f) for f in pattern]
    assert ours[0] == reference_scales(64.0, found, interval=interval, lag=1)
    # The lag moves only the scale: the same steps are skipped, the same params result
    # (power-of-two scales unscale exactly).
    theirs = train(lambda: torch.amp.GradScaler("cpu", 64.0, growth_interval=interval), pattern)
    assert ours[1] == theirs[1]
    assert _same_params(ours[2], theirs[2])


@pytest.mark.parametrize("switch_interval", [1e-6, 1e-3, 0.05])
def test_lagged_sequence_is_identical_whatever_the_thread_timing(switch_interval):
    pattern = [0, "inf", 0, 0, 0, "nan", "inf", 0, 0, 0, 0, 0]
    old = sys.getswitchinterval()
    sys.setswitchinterval(switch_interval)
    try:
        runs = [train(lambda: GradScaler(32.0, growth_interval=2), pattern, mode="async") for _ in range(3)]
    finally:
        sys.setswitchinterval(old)
    expected = reference_scales(32.0, [bool(f) for f in pattern], interval=2, lag=1)
    for scales, _, _ in runs:
        assert scales == expected


def test_growth_every_interval_matches_torch():
    pattern = [0] * 12
    ours = train(lambda: GradScaler(1.0, growth_interval=3), pattern)
    theirs = train(lambda: torch.amp.GradScaler("cpu", 1.0, growth_interval=3), pattern)
    assert ours[0] == theirs[0] == [1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8, 16]


@pytest.mark.parametrize("mode", ["plain", "job_wait"])
def test_clipping_after_unscale_matches_torch_bitwise(mode):
    pattern = [0, 0, "inf", 0, 0, 0]
    ours = train(lambda: GradScaler(2.0**10, growth_interval=2), pattern, mode=mode, clip=0.05)
    theirs = train(lambda: torch.amp.GradScaler("cpu", 2.0**10, growth_interval=2), pattern, clip=0.05)
    assert ours[0] == theirs[0]
    assert _same_params(ours[2], theirs[2])


def _two_optimizers(model):
    first, second = list(model.children())[0], list(model.children())[2]
    return [
        torch.optim.SGD(first.parameters(), lr=0.05),
        torch.optim.AdamW(second.parameters(), lr=0.01),
    ]


@pytest.mark.parametrize("mode", ["plain", "job_wait"])
def test_two_optimizers_on_one_scaler_match_torch_bitwise(mode):
    pattern = [0, "inf", 0, 0, 0, 0, "nan", 0]
    ours = train(lambda: GradScaler(256.0, growth_interval=2), pattern, mode, _two_optimizers)
    theirs = train(lambda: torch.amp.GradScaler("cpu", 256.0, growth_interval=2), pattern, "plain", _two_optimizers)
    assert ours[0] == theirs[0]
    assert _same_params(ours[2], theirs[2])


@pytest.mark.parametrize("mode", ["plain", "job_wait"])
@pytest.mark.parametrize("clip", [0.0, 0.05])
def test_fused_adam_matches_torch_bitwise(mode, clip):
    def fused(model):
        return [torch.optim.Adam(model.parameters(), lr=0.01, fused=True)]

    pattern = [0, 0, "inf", 0, 0, "nan", 0]
    ours = train(lambda: GradScaler(512.0, growth_interval=2), pattern, mode, fused, clip)
    theirs = train(lambda: torch.amp.GradScaler("cpu", 512.0, growth_interval=2), pattern, "plain", fused, clip)
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert _same_params(ours[2], theirs[2])


def test_update_is_async_false_restores_torch_sequence_with_queued_steps():
    pattern = [0, "inf", 0, 0, 0, "inf", 0, 0, 0]

    class SyncUpdate(GradScaler):
        def update(self, new_scale=None, is_async=True):
            super().update(new_scale, is_async=False)

    ours = train(lambda: SyncUpdate(16.0, growth_interval=2), pattern, mode="async")
    assert ours[0] == reference_scales(16.0, [bool(f) for f in pattern], interval=2)


@pytest.mark.parametrize("lag", [0, 1])
def test_min_max_bounds_follow_the_apex_rule(lag):
    pattern = [0] * 6 + ["inf"] * 5 + [0] * 6
    mode = "plain" if lag == 0 else "async"
    ours = train(lambda: GradScaler(2.0**3, growth_interval=1, min_scale=2.0, max_scale=2.0**6), pattern, mode)
    expected = reference_scales(
        2.0**3, [bool(f) for f in pattern], interval=1, lag=lag, min_scale=2.0, max_scale=2.0**6
    )
    assert ours[0] == expected
    assert max(expected) == 2.0**6 and min(expected) == 2.0


def _scales_used(mode):
    """Scale each iteration multiplied its loss by (read before update)."""
    import torch.nn.functional as F

    from roundpipe import optim_stream
    from scaler_loops import batches, inject, make_model

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = GradScaler(8.0, growth_interval=2)
    used = []
    for (x, y), fault in zip(batches(7), [0, 0, "inf", 0, 0, 0, 0]):
        used.append(scaler.get_scale())
        scaler.scale(F.mse_loss(model(x), y)).backward()
        inject(model, fault)
        job = optim_stream.launch(lambda: (scaler.step(opt), opt.zero_grad()))
        if mode == "plain":
            job.wait()
        scaler.update()
        job.wait()
    return used


def test_worked_example_in_docs_gradscaler_md():
    assert _scales_used("plain") == [8, 8, 16, 8, 8, 16, 16]
    assert _scales_used("async") == [8, 8, 8, 16, 8, 8, 16]
