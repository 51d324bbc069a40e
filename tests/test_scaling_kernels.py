"""roundpipe.scaling: torch's grouping of the fused unscale kernel and the update rule."""

import pytest
import torch

from roundpipe import scaling
from scaler_loops import reference_scales


class _Params:
    def __init__(self, *grads):
        self.params = []
        for grad in grads:
            p = torch.nn.Parameter(torch.zeros_like(grad))
            p.grad = grad
            self.params.append(p)
        self.param_groups = [{"params": self.params}]


def test_one_kernel_call_per_device_and_dtype_sharing_one_found_inf(monkeypatch):
    calls = []
    real = torch._amp_foreach_non_finite_check_and_unscale_

    def counting(grads, found_inf, inv_scale):
        calls.append((len(grads), grads[0].dtype, id(found_inf)))
        return real(grads, found_inf, inv_scale)

    monkeypatch.setattr(torch, "_amp_foreach_non_finite_check_and_unscale_", counting)
    holder = _Params(
        torch.ones(3),
        torch.ones(2, dtype=torch.bfloat16),
        torch.ones(4),
        torch.ones(1, dtype=torch.float64),
        torch.full((2,), float("inf"), dtype=torch.bfloat16),
    )
    found = scaling.unscale_grads_(holder.param_groups, torch.tensor(0.5), allow_fp16=False)
    assert [(n, dt) for n, dt, _ in calls] == [(2, torch.float32), (2, torch.bfloat16), (1, torch.float64)]
    assert len({fid for _, _, fid in calls}) == 1
    assert list(found) == [torch.device("cpu")] and found[torch.device("cpu")].item() == 1.0
    assert torch.equal(holder.params[0].grad, torch.full((3,), 0.5))


def test_no_grads_means_no_found_inf():
    holder = _Params(torch.ones(2))
    holder.params[0].grad = None
    assert scaling.unscale_grads_(holder.param_groups, torch.tensor(1.0), allow_fp16=False) == {}


def test_reciprocal_is_float64_rounded_to_float32():
    assert scaling.reciprocal_scale(torch.tensor(3.0)).item() == torch.tensor(1 / 3, dtype=torch.float32).item()


@pytest.mark.parametrize("interval", [1, 2, 3])
def test_update_rule_with_clamp_matches_an_independent_reference(interval):
    found = [False, False, True, True, False, False, False, False, True, False, False, False]
    scale, tracker = torch.tensor(4.0), torch.tensor(0, dtype=torch.int32)
    seen = []
    for f in found:
        scaling.update_scale_(scale, tracker, torch.tensor(float(f)), 2.0, 0.5, interval, 2.0, 16.0)
        seen.append(scale.item())
    assert seen == reference_scales(4.0, found, interval=interval, min_scale=2.0, max_scale=16.0)


def test_growth_never_overflows_to_inf():
    scale, tracker = torch.tensor(3e38), torch.tensor(0, dtype=torch.int32)
    scaling.update_scale_(scale, tracker, torch.tensor(0.0), 2.0, 0.5, 1)
    assert scale.item() == pytest.approx(3e38, rel=1e-6) and tracker.item() == 0


def test_sum_found_inf_does_not_modify_its_inputs():
    a, b = torch.tensor(1.0), torch.tensor(1.0)
    total = scaling.sum_found_inf([a, b], torch.device("cpu"))
    assert total.item() == 2.0 and a.item() == b.item() == 1.0
