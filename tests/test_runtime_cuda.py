"""The runtime on one CUDA device: the same contracts as on CPU."""

import pytest
import torch

from roundpipe import GradScaler, RoundPipe
from runtime_refs import loss_of, make_data, make_net, master_weight_loop, plain_loop
from test_runtime_training import OPTIMIZERS, _bitwise, run_roundpipe

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("name", ["sgd_momentum", "adamw"])
def test_cuda_sync_steps_match_plain_loop_bitwise(name):
    data = make_data(6, device="cuda")
    ref = plain_loop(make_net(device="cuda"), OPTIMIZERS[name], data)
    losses, _, params, _ = run_roundpipe(make_net(device="cuda"), OPTIMIZERS[name], data, is_async=False)
    assert losses == ref[0] and _bitwise(params, ref[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_async_low_precision_matches_staleness_one_reference(dtype):
    data = make_data(8, device="cuda")
    ref_losses, _, ref_final = master_weight_loop(
        make_net(dtype, device="cuda"), OPTIMIZERS["adam"], data, staleness=1, input_dtype=dtype
    )
    losses, _, params, _ = run_roundpipe(
        make_net(dtype, device="cuda"), OPTIMIZERS["adam"], data, True, torch.float32, dtype
    )
    assert losses == ref_losses
    assert _bitwise(params, [m.to(dtype) for m in ref_final])


def test_cuda_fp16_training_with_grad_scaler_runs_async_and_sync_update():
    data = make_data(30, device="cuda")
    for is_async_update in (True, False):
        model = RoundPipe(make_net(torch.float16, device="cuda"), optim_dtype=torch.float32)
        opt = torch.optim.AdamW(model.optim_parameters(), lr=1e-3)
        scaler = GradScaler("cuda", 2.0**20, growth_interval=3)
        for x, y in data:
            model.forward_backward((x.half(),), label=y, loss_fn=lambda o, t: scaler.scale(loss_of(o, t)))
            model.step(lambda: (scaler.step(opt), opt.zero_grad()))
            scaler.update(is_async=is_async_update)
        model.synchronize()
        assert scaler.get_scale() < 2.0**20  # fp16 overflowed at 2**20 and backed off
        assert all(torch.isfinite(p).all() for p in model.optim_parameters())
