"""CUDA paths: the same contracts on a GPU, plus no host syncs where torch has none."""

import pytest
import torch

from roundpipe import GradScaler, optim_stream
from scaler_loops import reference_scales, train

pytestmark = pytest.mark.cuda

PATTERN = [0, 0, "inf", 0, 0, 0, "nan", 0, 0, 0]


@pytest.mark.parametrize("mode", ["plain", "job_wait"])
def test_cuda_loop_matches_torch_bitwise(mode):
    ours = train(lambda: GradScaler("cuda", 1024.0, growth_interval=2), PATTERN, mode, device="cuda")
    theirs = train(lambda: torch.amp.GradScaler("cuda", 1024.0, growth_interval=2), PATTERN, device="cuda")
    assert ours[0] == theirs[0]
    assert ours[1] == theirs[1]
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))


def test_cuda_fused_adam_matches_torch_bitwise():
    def fused(m):
        return [torch.optim.Adam(m.parameters(), lr=0.01, fused=True)]

    ours = train(lambda: GradScaler(1024.0, growth_interval=2), PATTERN, "job_wait", fused, device="cuda")
    theirs = train(
        lambda: torch.amp.GradScaler("cuda", 1024.0, growth_interval=2), PATTERN, "plain", fused, device="cuda"
    )
    assert ours[0] == theirs[0]
    assert all(torch.equal(a, b) for a, b in zip(ours[2], theirs[2]))


def test_cuda_async_steps_follow_the_lag():
    ours = train(lambda: GradScaler(1024.0, growth_interval=2), PATTERN, "async", device="cuda")
    assert ours[0] == reference_scales(1024.0, [bool(f) for f in PATTERN], interval=2, lag=1)


def test_optimizer_jobs_run_on_their_own_cuda_stream():
    torch.cuda.init()
    main = torch.cuda.current_stream()
    job_stream = optim_stream.launch(torch.cuda.current_stream).wait()
    assert job_stream != main


def test_scale_and_update_do_not_sync_the_host():
    model = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    scaler = GradScaler(1024.0)
    for _ in range(2):  # warm up lazy initialisation
        scaler.scale(model(torch.randn(4, 8, device="cuda")).sum()).backward()
        scaler.step(opt)
        scaler.update()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss = scaler.scale(model(torch.randn(4, 8, device="cuda")).sum())
        loss.backward()
        optim_stream.launch(scaler.step, opt).wait()  # fused: no .item()
        scaler.update()
        scaler.scale(model(torch.randn(4, 8, device="cuda")).sum())
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_inline_calls_enter_the_optimizer_cuda_stream_and_leave_the_callers():
    torch.cuda.init()
    optim_stream.synchronize()
    main = torch.cuda.current_stream()
    seen = optim_stream.call(torch.cuda.current_stream)  # idle stream: runs on this thread
    assert seen == optim_stream.cuda_stream(main.device)
    assert torch.cuda.current_stream() == main
