"""roundpipe.compat: apex.amp's initialize / scaler / state-dict API on RoundPipe.

Everything runs on CPU; tests parametrized over DEVICES also run on CUDA when it exists.

The apex behaviour checked here is the one written down in
shared/reference/apex_amp_behaviour.md (§1 LossScaler, §3 initialize, §4 state dicts); the
dynamic loss-scale rule is checked against a pure-Python re-implementation of apex's
``LossScaler.update_scale`` written below, not against roundpipe's own code.
"""

from __future__ import annotations

import collections
import threading
from collections import OrderedDict
from typing import List

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import roundpipe.compat as amp
from compat_matrix.apex_column import fault_during_backward
from roundpipe import GradScaler, RoundPipe, RoundPipeRunConfig, optim_stream
from roundpipe.compat import scaler as scaler_module
from roundpipe.compat.casting import cast_floating
from roundpipe.compat.model import AmpRoundPipe
from roundpipe.compat.properties import resolve_properties

LEVELS = ["O0", "O1", "O2", "O3"]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
# O1's autocast dtype per device type: float16 as apex, bfloat16 on CPU
AUTOCAST_DTYPE = {"cpu": torch.bfloat16, "cuda": torch.float16}
PROPERTY_NAMES = [
    "cast_model_type",
    "patch_torch_functions",
    "keep_batchnorm_fp32",
    "master_weights",
    "loss_scale",
]


# ----------------------------------------------------------------------------- helpers
def make_net(seed: int = 0, batchnorm: bool = True, device: str = "cpu") -> nn.Module:
    torch.manual_seed(seed)
    layers: List[nn.Module] = [nn.Linear(4, 8)]
    if batchnorm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.ReLU(), nn.Linear(8, 3)]
    return nn.Sequential(*layers).to(device)


def make_data(steps: int = 1, batch: int = 16, seed: int = 1, device: str = "cpu"):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 4, generator=generator)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return [(x.to(device), y.to(device))] * steps


def sgd(params, lr: float = 0.1) -> torch.optim.SGD:
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def train(model, optimizer, data, is_async: bool = True, run_config=RoundPipeRunConfig()):
    """The migrated-apex loop of the module docs; returns the unscaled losses."""
    scaler = amp.loss_scaler()
    losses = []
    for x, y in data:
        loss = (
            model.forward_backward(
                input_args=(x,), label=y, loss_fn=scaled_cross_entropy(scaler), run_config=run_config
            )
            / scaler.get_scale()
        )

        def step_fn():
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 10.0)
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(step_fn, is_async=is_async)
        scaler.update()
        losses.append(loss.item())
    model.synchronize()
    return losses


def scaled_cross_entropy(scaler):
    """The migrated apex loss_fn: the loss, scaled."""
    return lambda out, label: scaler.scale(F.cross_entropy(out, label))


def step_and_report_skip(model, optimizer, x, y, overflow: bool) -> bool:
    """One synchronous iteration; inf reaches a gradient of the block when ``overflow``.
    Returns whether the optimizer step was skipped (the first master did not move)."""
    scaler = amp.loss_scaler()
    first = next(p for p in model.model.parameters() if p.requires_grad)
    with fault_during_backward(first, "inf" if overflow else None):
        model.forward_backward(input_args=(x,), label=y, loss_fn=scaled_cross_entropy(scaler))
    skipped = []

    def step_fn():
        first = next(amp.master_params(optimizer))
        before = first.detach().clone()
        scaler.step(optimizer)
        skipped.append(torch.equal(before, first.detach()))
        optimizer.zero_grad()

    model.step(step_fn, is_async=False)
    scaler.update()
    return skipped[0]


def initialize(*args, **kwargs):
    kwargs.setdefault("verbosity", 0)
    return amp.initialize(*args, **kwargs)


# -------------------------------------------------------------------- property table
def test_opt_levels_is_apexs_property_table():
    f16, f32 = torch.float16, torch.float32
    expected = {
        "O0": (f32, False, None, False, 1.0),
        "O1": (None, True, None, None, "dynamic"),
        "O2": (f16, False, True, True, "dynamic"),
        "O3": (f16, False, False, False, 1.0),
    }
    assert set(amp.OPT_LEVELS) == set(expected)
    for level, row in expected.items():
        assert amp.OPT_LEVELS[level] == dict(zip(PROPERTY_NAMES, row), enabled=True)


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_resolves_to_its_row(level):
    properties = resolve_properties(level)
    assert properties.opt_level == level
    row = amp.OPT_LEVELS[level]
    assert {name: getattr(properties, name) for name in row} == row


@pytest.mark.parametrize(
    "level, overrides, expected",
    [
        ("O2", {"keep_batchnorm_fp32": "False"}, {"keep_batchnorm_fp32": False}),
        ("O2", {"keep_batchnorm_fp32": "True"}, {"keep_batchnorm_fp32": True}),
        ("O3", {"keep_batchnorm_fp32": True}, {"keep_batchnorm_fp32": True}),
        ("O2", {"master_weights": False}, {"master_weights": False}),
        ("O2", {"cast_model_type": torch.bfloat16}, {"cast_model_type": torch.bfloat16}),
        ("O0", {"patch_torch_functions": False}, {"patch_torch_functions": False}),
        ("O1", {"patch_torch_functions": False}, {"patch_torch_functions": False}),
        ("O1", {"cast_model_type": torch.float32}, {"cast_model_type": torch.float32}),
        ("O1", {"cast_model_type": False}, {"cast_model_type": False}),
        ("O2", {"loss_scale": "128.0"}, {"loss_scale": 128.0}),
        ("O2", {"loss_scale": 512}, {"loss_scale": 512.0}),
        ("O3", {"loss_scale": "dynamic"}, {"loss_scale": "dynamic"}),
        ("O1", {"loss_scale": 1}, {"loss_scale": 1.0}),
    ],
)
def test_overrides_replace_the_level_defaults(level, overrides, expected):
    properties = resolve_properties(level, **overrides)
    row = dict(amp.OPT_LEVELS[level], **expected)
    assert {name: getattr(properties, name) for name in row} == row
    assert type(properties.loss_scale) is type(row["loss_scale"])


# -------------------------------------------------------------------- validation errors
@pytest.mark.parametrize("level", [None, "o1", "01", "O4", "", 1])
def test_unknown_opt_level_is_a_runtime_error_with_the_letter_o_hint(level):
    with pytest.raises(RuntimeError, match="the prefix O is the letter O, not the number zero"):
        initialize(make_net(), opt_level=level)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"cast_model_type": torch.float16}, "O1"),
        ({"keep_batchnorm_fp32": True}, "keep_batchnorm_fp32"),
        ({"keep_batchnorm_fp32": "False"}, "keep_batchnorm_fp32"),
        ({"master_weights": False}, "master_weights"),
        ({"master_weights": True}, "master_weights"),
    ],
)
def test_o1_override_checks(overrides, match):
    with pytest.raises(RuntimeError, match=match):
        initialize(make_net(), opt_level="O1", **overrides)


@pytest.mark.parametrize("level", ["O0", "O2", "O3"])
def test_patch_torch_functions_needs_o1(level):
    with pytest.raises(RuntimeError, match="patch_torch_functions"):
        initialize(make_net(), opt_level=level, patch_torch_functions=True)


@pytest.mark.parametrize("value", ["true", "false", 1, 0, "yes"])
def test_keep_batchnorm_fp32_rejects_other_values_with_an_assertion(value):
    with pytest.raises(AssertionError, match="keep_batchnorm_fp32"):
        initialize(make_net(), opt_level="O2", keep_batchnorm_fp32=value)


@pytest.mark.parametrize("value", ["abc", "Dynamic", "DYNAMIC"])
def test_loss_scale_must_be_dynamic_or_a_number(value):
    with pytest.raises(ValueError):
        initialize(make_net(), opt_level="O2", loss_scale=value)


def test_models_and_optimizers_must_be_single_or_lists():
    net = make_net()
    opt = sgd(net.parameters())
    with pytest.raises(TypeError, match="optimizers must be either a single optimizer or a list"):
        initialize(net, (opt,), opt_level="O2")
    with pytest.raises(TypeError, match="optimizers must be either"):
        initialize(net, [opt, "not an optimizer"], opt_level="O2")
    with pytest.raises(TypeError, match="models must be either a single model or a list"):
        initialize((net,), opt, opt_level="O2")
    with pytest.raises(TypeError, match="models must be either"):
        initialize([net, 3], opt, opt_level="O2")
    assert opt.param_groups[0]["params"][0] is next(net.parameters())  # nothing was touched


@pytest.mark.parametrize("wrapper", ["DataParallel", "DistributedDataParallel"])
def test_parallel_wrapped_models_are_refused(wrapper):
    if wrapper == "DataParallel":
        model = nn.DataParallel(make_net())
    else:  # needs no process group: the type check comes first
        model = nn.parallel.DistributedDataParallel.__new__(nn.parallel.DistributedDataParallel)
    with pytest.raises(RuntimeError, match=f"{wrapper}.*AFTER"):
        initialize(model, opt_level="O1")


def test_roundpipe_and_half_models_are_refused():
    with pytest.raises(RuntimeError, match="already a RoundPipe"):
        initialize(RoundPipe(make_net()), opt_level="O1")
    with pytest.raises(RuntimeError, match=r"do not need to call \.half\(\)"):
        initialize(make_net().half(), opt_level="O2")


def test_an_optimizer_goes_through_initialize_once():
    net = make_net()
    opt = sgd(net.parameters())
    initialize(net, opt, opt_level="O1")
    with pytest.raises(RuntimeError, match="only be passed through .* once"):
        initialize(make_net(), opt, opt_level="O1")


@pytest.mark.parametrize(
    "level, overrides",
    [
        ("O3", {"loss_scale": "dynamic"}),
        ("O3", {"loss_scale": 128.0}),
        ("O2", {"master_weights": False}),
    ],
)
def test_float16_parameters_without_master_weights_train(level, overrides):
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters(), lr=0.05), opt_level=level, **overrides)
    assert all(c.dtype == torch.float16 for c in model.optim_parameters())
    losses = train(model, opt, make_data(25))
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]


def test_amp_state_is_needed_before_use(monkeypatch):
    monkeypatch.setattr(scaler_module, "_shared", None)
    for call in (amp.state_dict, amp.loss_scaler, lambda: amp.load_state_dict({})):
        with pytest.raises(RuntimeError, match="call roundpipe.compat.initialize first"):
            call()


def test_loss_ids_index_the_losses_like_a_list():
    initialize(make_net(), opt_level="O1", num_losses=3)
    scalers = [amp.loss_scaler(i) for i in range(3)]
    assert len({id(s) for s in scalers}) == 3  # one scaler per loss, as apex
    assert amp.loss_scaler(-1) is scalers[2] and amp.loss_scaler(-3) is scalers[0]
    for bad in (3, -4):
        with pytest.raises(IndexError, match="num_losses=3"):
            amp.loss_scaler(bad)
    with pytest.raises(TypeError):
        amp.loss_scaler(0.5)


# ------------------------------------------------------------------------ return shapes
def test_return_shapes_follow_the_arguments():
    net, net2 = make_net(0), make_net(1)
    model = initialize(net, opt_level="O1")
    assert isinstance(model, AmpRoundPipe) and model.model is net

    models = initialize([make_net(), make_net()], opt_level="O1")
    assert isinstance(models, list) and len(models) == 2

    opt = sgd(net2.parameters())
    model, out = initialize(net2, opt, opt_level="O1")
    assert isinstance(model, AmpRoundPipe) and out is opt

    nets = [make_net(0), make_net(1)]
    opts = [sgd(nets[0].parameters()), sgd(nets[1].parameters())]
    models, outs = initialize(nets, opts, opt_level="O2")
    assert [m.model for m in models] == nets and outs is opts

    net3 = make_net(2)
    opts = [sgd(net3[0].parameters()), sgd(net3[-1].parameters())]
    model, outs = initialize(net3, opts, opt_level="O2")
    assert isinstance(model, AmpRoundPipe) and outs is opts

    nets = [make_net(0), make_net(1)]
    opt = sgd([p for n in nets for p in n.parameters()])
    models, out = initialize(nets, opt, opt_level="O2")
    assert isinstance(models, list) and out is opt

    model, outs = initialize(make_net(), [], opt_level="O1")
    assert isinstance(model, AmpRoundPipe) and outs == []


def test_enabled_false_wraps_without_casting_so_the_migrated_loop_still_runs():
    net = make_net()
    opt = sgd(net.parameters())
    before = [p.detach().clone() for p in net.parameters()]
    model, out = initialize(net, opt, enabled=False, opt_level="not checked")
    assert isinstance(model, AmpRoundPipe) and model.model is net and out is opt
    assert opt.param_groups[0]["params"] == list(model.optim_parameters())
    assert all(p.dtype == torch.float32 for p in net.parameters())
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))
    assert not amp.loss_scaler().is_enabled()
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}}
    x = torch.randn(4, next(net.parameters()).shape[1])
    assert torch.equal(model(x), net(x))  # no casting
    models = initialize([make_net()], enabled=False)
    assert isinstance(models, list) and isinstance(models[0], AmpRoundPipe)


# ---------------------------------------------------------- models, copies, optimizers
F16, F32, BF16 = torch.float16, torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "level, overrides, model_dtype, bn_dtype, copy_dtype, scaler_enabled",
    [
        ("O0", {}, F32, F32, F32, False),
        ("O1", {}, F32, F32, F32, True),
        ("O2", {}, F16, F32, F32, True),
        ("O2", {"keep_batchnorm_fp32": "True"}, F16, F32, F32, True),
        ("O2", {"keep_batchnorm_fp32": False}, F16, F16, F32, True),
        ("O2", {"keep_batchnorm_fp32": "False"}, F16, F16, F32, True),
        ("O2", {"cast_model_type": BF16}, BF16, F32, F32, True),
        ("O3", {}, F16, F16, F16, False),
        ("O3", {"keep_batchnorm_fp32": True}, F16, F32, F16, False),
    ],
)
def test_levels_convert_models_and_copies(level, overrides, model_dtype, bn_dtype, copy_dtype, scaler_enabled):
    net = make_net()
    opt = sgd(net.parameters())
    model, opt = initialize(net, opt, opt_level=level, **overrides)
    linear, batchnorm = net[0], net[1]
    assert linear.weight.dtype == net[-1].bias.dtype == model_dtype
    assert batchnorm.weight.dtype == batchnorm.running_mean.dtype == bn_dtype
    copies = list(model.optim_parameters())
    assert all(
        c.dtype == (copy_dtype if p.dtype != torch.float32 else torch.float32) for p, c in zip(net.parameters(), copies)
    )
    assert amp.loss_scaler().is_enabled() is scaler_enabled


def test_non_affine_batchnorm_is_converted_even_when_kept():
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8, affine=False))
    initialize(net, opt_level="O2")
    assert net[1].running_mean.dtype == torch.float16


def test_optimizer_is_mutated_in_place_onto_the_copies():
    net = make_net()
    opt = torch.optim.SGD(
        [{"params": net[0].parameters(), "lr": 0.01}, {"params": net[-1].parameters()}],
        lr=0.1,
        momentum=0.9,
    )
    groups = opt.param_groups
    model, out = initialize(net, opt, opt_level="O2")
    assert out is opt and opt.param_groups is groups
    copy_of = model.copy_map()
    assert opt.param_groups[0]["params"] == [copy_of[p] for p in net[0].parameters()]
    assert opt.param_groups[1]["params"] == [copy_of[p] for p in net[-1].parameters()]
    assert opt.param_groups[0]["lr"] == 0.01 and opt.param_groups[1]["lr"] == 0.1
    masters = list(amp.master_params(opt))
    assert masters == opt.param_groups[0]["params"] + opt.param_groups[1]["params"]
    assert all(m.dtype == torch.float32 for m in masters)
    assert {id(m) for m in masters} <= {id(c) for c in model.optim_parameters()}


def test_optimizer_state_moves_to_the_copies_and_is_cast():
    net = make_net(batchnorm=False)
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    net(torch.randn(5, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
    before = {name: dict(opt.state[p]) for name, p in net.named_parameters()}
    model, opt = initialize(net, opt, opt_level="O3")  # float16 copies, static 1.0
    assert not any(p in opt.state for p in net.parameters())
    for (name, _), copy in zip(net.named_parameters(), model.optim_parameters()):
        state = opt.state[copy]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float16
        assert torch.equal(state["exp_avg"], before[name]["exp_avg"].half())
        assert state["step"].dtype == torch.float32 and state["step"].item() == 1.0
    train(model, opt, make_data(2))  # Adam continues from the moved state


def test_one_optimizer_over_several_models():
    nets = [make_net(0), make_net(1)]
    opt = sgd([p for n in nets for p in n.parameters()])
    models, opt = initialize(nets, opt, opt_level="O2")
    copies = [c for m in models for c in m.optim_parameters()]
    assert list(amp.master_params(opt)) == copies
    before = [c.detach().clone() for c in copies]
    scaler = amp.loss_scaler()
    x, y = make_data()[0]
    for model in models:
        model.forward_backward(input_args=(x,), label=y, loss_fn=scaled_cross_entropy(scaler))
    models[0].step(lambda: None)  # hands model 0's gradients over; the step runs once below

    def step_fn():
        scaler.step(opt)
        opt.zero_grad()

    models[1].step(step_fn, is_async=False)
    scaler.update()
    models[0].synchronize()
    assert all(not torch.equal(b, c) for b, c in zip(before, copies))  # every master stepped
    for model in models:  # and both models took the new weights
        pairs = zip(model.model[-1].parameters(), list(model.optim_parameters())[-2:])
        assert all(torch.equal(p, c.half()) for p, c in pairs)


def test_model_state_dict_reports_float32_under_o2_and_the_module_is_left_alone():
    net = make_net()
    model = initialize(net, opt_level="O2")
    model(torch.randn(3, 4))
    assert "forward" not in net.__dict__
    state = net.state_dict()
    assert state["0.weight"].dtype == torch.float32 and net[0].weight.dtype == torch.float16
    assert state["1.num_batches_tracked"].dtype == torch.int64
    assert net[0].state_dict()["weight"].dtype == torch.float32


# ------------------------------------------------------------- input and output casting
class _Batch:
    def __init__(self, tensor):
        self.tensor = tensor

    def to(self, dtype):
        return _Batch(self.tensor.to(dtype))


_Pair = collections.namedtuple("_Pair", "a b")


def test_cast_floating_follows_apexs_applier():
    f64 = torch.ones(2, dtype=torch.float64)
    ints = torch.arange(3)
    value = {
        "t": f64,
        "i": ints,
        "l": [f64, "s", 3, None],
        "tup": (f64, ints),
        "nt": _Pair(f64, 1),
        "od": OrderedDict(x=f64),
        "batch": _Batch(f64),
        "b": b"bytes",
        "set": {1, 2},
    }
    out = cast_floating(value, torch.float16)
    assert type(out) is dict
    assert out["t"].dtype == torch.float16 and out["i"] is ints
    assert type(out["l"]) is list and out["l"][0].dtype == torch.float16
    assert out["l"][1:] == ["s", 3, None]
    assert type(out["tup"]) is tuple and out["tup"][1] is ints
    assert type(out["nt"]) is _Pair and out["nt"].a.dtype == torch.float16 and out["nt"].b == 1
    assert type(out["od"]) is dict and out["od"]["x"].dtype == torch.float16
    assert isinstance(out["batch"], _Batch) and out["batch"].tensor.dtype == torch.float16
    assert out["b"] == b"bytes" and out["set"] == {1, 2}


class _InputProbe(nn.Module):
    """Records what its forward receives; returns (floating output, integer tensor)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.seen = []

    def forward(self, x, extras, batch, name, count, mapping=None):
        self.seen.append(dict(x=x, extras=extras, batch=batch, name=name, count=count, mapping=mapping))
        return self.lin(x), torch.zeros(x.shape[0], dtype=torch.int64)


def test_o2_casts_inputs_to_half_and_outputs_to_float():
    net = _InputProbe()
    model = initialize(net, opt_level="O2")
    x = torch.randn(2, 4)
    out, ints = model(x, [x, (x, torch.arange(2))], _Batch(x), "name", 7, mapping=OrderedDict(k=x))
    seen = net.seen[-1]
    assert seen["x"].dtype == torch.float16
    assert type(seen["extras"]) is list and seen["extras"][0].dtype == torch.float16
    assert type(seen["extras"][1]) is tuple and seen["extras"][1][0].dtype == torch.float16
    assert seen["extras"][1][1].dtype == torch.int64
    assert isinstance(seen["batch"], _Batch) and seen["batch"].tensor.dtype == torch.float16
    assert seen["name"] == "name" and seen["count"] == 7
    assert type(seen["mapping"]) is dict and seen["mapping"]["k"].dtype == torch.float16
    assert out.dtype == torch.float32 and ints.dtype == torch.int64


def test_forward_backward_casts_for_the_loss_fn_and_the_returned_outputs():
    net = _InputProbe()
    model = initialize(net, opt_level="O2")
    x = torch.randn(4, 4)
    seen_by_loss = []

    def loss_fn(outputs, label):
        seen_by_loss.append(outputs[0].dtype)
        return outputs[0].float().sum()

    _, outputs = model.forward_backward(
        input_args=(x, [], _Batch(x), "n", 1), label=None, loss_fn=loss_fn, return_outputs=True
    )
    assert net.seen[-1]["x"].dtype == torch.float16
    assert seen_by_loss == [torch.float32] and outputs[0].dtype == torch.float32
    assert net.lin.weight.grad.dtype == torch.float16


@pytest.mark.parametrize(
    "level, cast_model_outputs, input_dtype, seen_dtype, output_dtype",
    [
        ("O2", torch.float16, torch.float32, torch.float16, torch.float16),
        ("O3", None, torch.float32, torch.float16, torch.float32),
        ("O0", None, torch.float64, torch.float32, torch.float32),
        ("O0", torch.float64, torch.float32, torch.float32, torch.float64),
        ("O1", torch.float64, torch.float32, torch.float32, torch.float64),  # outputs only
        ("O1", None, torch.float32, torch.float32, torch.bfloat16),  # CPU autocast, uncast
    ],
)
def test_cast_model_outputs(level, cast_model_outputs, input_dtype, seen_dtype, output_dtype):
    net = _InputProbe()
    model = initialize(net, opt_level=level, cast_model_outputs=cast_model_outputs)
    out, ints = model(torch.randn(2, 4, dtype=input_dtype), [], None, "n", 0)
    assert net.seen[-1]["x"].dtype == seen_dtype
    assert out.dtype == output_dtype and ints.dtype == torch.int64


# ------------------------------------------------------------------------- O1 autocast
class _AutocastProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.seen = []

    def forward(self, x):
        out = self.lin(x)
        self.seen.append((torch.is_autocast_enabled(x.device.type), out.dtype))
        return out


@pytest.mark.parametrize("device", DEVICES)
def test_o1_runs_forward_and_loss_fn_under_autocast_and_backward_outside(device):
    net = _AutocastProbe().to(device)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O1")
    scaler = amp.loss_scaler()
    in_loss, in_backward = [], []
    low = AUTOCAST_DTYPE[device]

    def loss_fn(out, label):
        in_loss.append((torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)))
        out.register_hook(lambda grad: in_backward.append(torch.is_autocast_enabled(device)))
        loss = F.cross_entropy(out, label)  # autocast runs cross_entropy in float32
        in_loss.append(loss.dtype)
        return scaler.scale(loss)

    x, y = make_data(batch=4, device=device)[0]
    model.forward_backward(input_args=(x,), label=y, loss_fn=loss_fn)
    assert net.seen == [(True, low)]
    assert in_loss == [(True, low), torch.float32]
    assert in_backward == [False]
    copy = next(model.optim_parameters())  # the block's exit moved the gradient there
    assert net.lin.weight.dtype == copy.grad.dtype == torch.float32 and net.lin.weight.grad is None
    model(x)
    assert net.seen[-1] == (True, low)


@pytest.mark.parametrize("device", DEVICES)
def test_o1_casts_the_whole_thread_but_not_the_step_until_the_next_initialize(device):
    """apex's O1 patches torch for the whole program, the optimizer step excepted."""
    net = _AutocastProbe().to(device)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O1")
    x = make_data(batch=4, device=device)[0][0]
    net(x)  # the module called directly, outside the RoundPipe
    assert net.seen == [(True, AUTOCAST_DTYPE[device])]
    in_step = []
    model.step(lambda: in_step.append(torch.is_autocast_enabled(device)), is_async=False)
    assert in_step == [False]
    initialize(_AutocastProbe().to(device), opt_level="O0")
    assert not torch.is_autocast_enabled(device)


@pytest.mark.parametrize("device", DEVICES)
def test_o1_evaluation_loss_after_a_plain_forward_is_float32_as_apex(device):
    """apex's O1 runs its loss functions in float32 wherever they are called, so a
    validation loss computed from a forward's low-precision output is float32."""
    net = _AutocastProbe().to(device)
    model = initialize(net, opt_level="O1")
    x, y = make_data(batch=4, device=device)[0]
    with torch.no_grad():
        out = model(x)
        loss = F.cross_entropy(out, y)
    assert out.dtype == AUTOCAST_DTYPE[device]
    assert loss.dtype == torch.float32
    assert loss == F.cross_entropy(out.float(), y)


def test_o1_without_patching_runs_no_autocast():
    net = _AutocastProbe()
    model = initialize(net, opt_level="O1", patch_torch_functions=False)
    model(torch.randn(2, 4))
    assert net.seen == [(False, torch.float32)]


# ------------------------------------------------------------------------------ training
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("is_async", [True, False])
def test_each_level_trains_a_toy_problem(level, is_async, device):
    net = make_net(device=device)
    model, opt = initialize(net, sgd(net.parameters(), lr=0.05), opt_level=level)
    losses = train(model, opt, make_data(25, device=device), is_async=is_async)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[-1] < 0.7 * losses[0]


def test_o2_trains_with_microbatches():
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters(), lr=0.05), opt_level="O2")
    losses = train(model, opt, make_data(20), run_config=RoundPipeRunConfig(num_microbatch=4))
    assert losses[-1] < 0.7 * losses[0]


# ------------------------------------------------------ the scale sequence against apex
class ApexLossScaler:
    """apex's dynamic LossScaler.update_scale (scaler.py:197-217), from the spec §1.2."""

    def __init__(self, min_loss_scale, max_loss_scale, init_scale=2.0**16, scale_window=2000):
        self.scale = min(max_loss_scale, init_scale)
        self.min_loss_scale = min_loss_scale
        self.max_loss_scale = max_loss_scale
        self.scale_window = scale_window
        self.unskipped = 0

    def update_scale(self, overflow: bool) -> bool:
        if overflow:
            should_skip = True
            halved = self.scale / 2.0
            self.scale = max(self.min_loss_scale, halved) if self.min_loss_scale else halved
            self.unskipped = 0
        else:
            should_skip = False
            self.unskipped += 1
        if self.unskipped == self.scale_window:
            self.scale = min(self.max_loss_scale, self.scale * 2.0)
            self.unskipped = 0
        return should_skip


# Growth windows, a run of overflows long enough to reach a floor, and isolated overflows.
OVERFLOW_PATTERN = [False] * 10 + [True] * 5 + [False] * 3 + [True] + [False] * 7 + [True] + [False] * 3


@pytest.mark.parametrize(
    "min_loss_scale, max_loss_scale, start, extremes",
    [
        (2.0**14, 2.0**18, None, (2.0**14, 2.0**18)),  # the max cap and the min floor bind
        (None, 2.0**24, 2.0**23, (2.0**19, 2.0**24)),  # apex's default cap, from 2**23
        (0.0, 2.0**24, 2.0**6, (2.0**4, 2.0**9)),  # a falsy floor is no floor
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_dynamic_scale_sequence_equals_apexs(min_loss_scale, max_loss_scale, start, extremes, device):
    window = 3
    net = make_net(batchnorm=False, device=device)
    model, opt = initialize(  # float32 throughout: only the forced steps overflow
        net,
        sgd(net.parameters(), lr=0.01),
        opt_level="O1",
        patch_torch_functions=False,
        min_loss_scale=min_loss_scale,
        max_loss_scale=max_loss_scale,
    )
    scaler = amp.loss_scaler()
    scaler.set_growth_interval(window)  # apex's scale_window, 2000 by default
    reference = ApexLossScaler(min_loss_scale, max_loss_scale, scale_window=window)
    if start is not None:  # as apex's amp.load_state_dict sets it
        amp.load_state_dict({"loss_scaler0": {"loss_scale": start, "unskipped": 0}})
        reference.scale = start
    assert scaler.get_scale() == reference.scale

    x, y = make_data(device=device)[0]
    scales, skips, expected_skips = [], [], []
    for overflow in OVERFLOW_PATTERN:
        skips.append(step_and_report_skip(model, opt, x, y, overflow))
        expected_skips.append(reference.update_scale(overflow))
        entry = amp.state_dict()["loss_scaler0"]
        assert (entry["loss_scale"], entry["unskipped"]) == (reference.scale, reference.unskipped)
        scales.append(scaler.get_scale())
    assert skips == expected_skips
    assert (min(scales), max(scales)) == extremes


def test_static_loss_scale_is_fixed_and_still_skips_non_finite_steps():
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O2", loss_scale="128.0")
    scaler = amp.loss_scaler()
    scaler.set_growth_interval(1)  # would grow at every step if the scale were not fixed
    x, y = make_data()[0]
    for overflow in (False, True, False, False):
        assert scaler.get_scale() == 128.0
        assert step_and_report_skip(model, opt, x, y, overflow) is overflow
        assert scaler.get_scale() == 128.0


def test_verbosity_prints_the_resolved_properties(capsys):
    amp.initialize(make_net(), opt_level="O2", loss_scale="64")
    printed = capsys.readouterr().out
    assert "properties of O2" in printed and "loss_scale             : 64.0" in printed
    initialize(make_net(), opt_level="O2")
    assert capsys.readouterr().out == ""


def test_default_scalers():
    initialize(make_net(), opt_level="O1")
    dynamic = amp.loss_scaler()
    assert dynamic.is_enabled() and dynamic.get_scale() == 2.0**16
    assert dynamic.get_growth_interval() == 2000
    initialize(make_net(), opt_level="O1", max_loss_scale=2.0**10)
    assert amp.loss_scaler().get_scale() == 2.0**10
    for level in ("O0", "O3"):
        initialize(make_net(), opt_level=level)
        assert not amp.loss_scaler().is_enabled()


# --------------------------------------------------------------------------- state dicts
def _dynamic_setup(num_losses: int = 1):
    initialize(make_net(), opt_level="O1", num_losses=num_losses)
    return amp.loss_scaler()


def test_state_dict_is_apexs_format():
    scaler = _dynamic_setup(num_losses=2)
    state = amp.state_dict()
    assert type(state) is OrderedDict
    assert state == {
        "loss_scaler0": {"loss_scale": 65536.0, "unskipped": 0},
        "loss_scaler1": {"loss_scale": 65536.0, "unskipped": 0},
    }
    assert type(state["loss_scaler0"]["loss_scale"]) is float
    assert type(state["loss_scaler0"]["unskipped"]) is int
    destination = {"other": 1}
    assert amp.state_dict(destination) is destination
    assert list(destination) == ["other", "loss_scaler0", "loss_scaler1"]
    assert scaler.get_scale() == 65536.0


def test_round_trip_through_apex_format():
    scaler = _dynamic_setup()
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}})
    assert scaler.get_scale() == 1024.0 and scaler.state_dict()["unskipped"] == 7
    saved = amp.state_dict()
    assert saved == {"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}}
    fresh = _dynamic_setup()
    amp.load_state_dict(saved)
    assert fresh.get_scale() == 1024.0 and amp.state_dict() == saved


def test_apex_entries_are_read_by_position():
    scaler = _dynamic_setup(num_losses=2)
    amp.load_state_dict(
        OrderedDict(
            [
                ("loss_scaler1", {"loss_scale": 1024.0, "unskipped": 1}),
                ("loss_scaler0", {"loss_scale": 2048.0, "unskipped": 2}),
            ]
        )
    )
    assert scaler.state_dict() == {"loss_scale": 1024.0, "unskipped": 1}
    assert amp.loss_scaler(1).state_dict() == {"loss_scale": 2048.0, "unskipped": 2}


def test_apex_load_warnings_and_unexpected_keys():
    scaler = _dynamic_setup()
    with pytest.warns(UserWarning, match="3 entries, while 1 loss scalers"):
        with pytest.warns(UserWarning, match="skipping loss_scaler"):
            amp.load_state_dict(
                {
                    "loss_scaler0": {"loss_scale": 512.0, "unskipped": 3},
                    "loss_scaler1": {"loss_scale": 8.0, "unskipped": 0},
                    "loss_scaler2": {"loss_scale": 8.0, "unskipped": 0},
                }
            )
    assert scaler.get_scale() == 512.0
    with pytest.warns(UserWarning, match="2 entries"):
        with pytest.raises(RuntimeError, match='Unexpected key.*"model"'):
            amp.load_state_dict({"model": {}, "loss_scaler0": {"loss_scale": 256.0, "unskipped": 0}})
    assert scaler.get_scale() == 256.0  # applied before the error, as apex


def test_load_accepts_a_gradscaler_state_dict():
    scaler = _dynamic_setup()
    other = GradScaler(init_scale=32.0, growth_interval=5)
    amp.load_state_dict(other.state_dict())
    assert scaler.get_scale() == 32.0 and scaler.get_growth_interval() == 5
    torch_scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    amp.load_state_dict(torch_scaler.state_dict())
    assert scaler.get_scale() == 16.0


def test_loading_into_a_disabled_scaler_is_ignored():
    initialize(make_net(), enabled=False)
    amp.load_state_dict({"loss_scaler0": {"loss_scale": 1024.0, "unskipped": 7}})
    assert amp.state_dict() == {"loss_scaler0": {"loss_scale": 1.0, "unskipped": 0}}


def test_checkpoint_of_a_migrated_loop_resumes(tmp_path):
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O2")
    amp.loss_scaler().set_growth_interval(2)
    train(model, opt, make_data(5))
    path = tmp_path / "ckpt.pt"
    torch.save({"model": net.state_dict(), "optimizer": opt.state_dict(), "amp": amp.state_dict()}, path)
    checkpoint = torch.load(path)
    assert checkpoint["model"]["0.weight"].dtype == torch.float32

    net2 = make_net(seed=5, batchnorm=False)
    model2, opt2 = initialize(net2, sgd(net2.parameters()), opt_level="O2")
    net2.load_state_dict(checkpoint["model"])
    opt2.load_state_dict(checkpoint["optimizer"])
    amp.load_state_dict(checkpoint["amp"])
    assert amp.state_dict() == checkpoint["amp"]
    assert all(torch.equal(a, b) for a, b in zip(net.parameters(), net2.parameters()))
    masters = zip(model.optim_parameters(), model2.optim_parameters())
    assert all(torch.equal(a.half().float(), b) for a, b in masters)  # rebuilt from fp16 weights
    train(model2, opt2, make_data(2))


# ------------------------------------------------- roundpipe.GradScaler is torch's kind
def test_roundpipe_gradscaler_is_a_torch_gradscaler_without_its_state():
    scaler = GradScaler(init_scale=8.0)
    assert issubclass(GradScaler, torch.amp.GradScaler) and isinstance(scaler, torch.amp.GradScaler)
    torch_names = {k for k in vars(torch.amp.GradScaler) if not k.startswith("__")} | {
        "__init__",
        "__getstate__",
        "__setstate__",
    }
    assert all(name in vars(GradScaler) for name in torch_names)  # every method is ours
    assert "_per_optimizer_states" not in vars(scaler)  # torch's __init__ never ran

    param = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=1.0)
    (scaler.scale(param.sum()) * 0 + param.sum() * float("inf")).backward()
    scaler.step(optimizer)  # the inf gradient skips the step, through our code
    scaler.update()
    assert torch.equal(param.detach(), torch.ones(2)) and scaler.get_scale() == 4.0
    state = {"stage": None, "found_inf_per_device": {torch.device("cpu"): torch.zeros(())}}
    param.grad = torch.ones(2)
    scaler._maybe_opt_step(optimizer, state)
    assert torch.equal(param.detach(), torch.zeros(2))


# ------------------------------------------- differences from apex that are kept (docs)
def test_kept_difference_bf16_under_o2_trains_with_float32_masters():
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters(), lr=0.05), opt_level="O2", cast_model_type=torch.bfloat16)
    assert {p.dtype for p in net.parameters()} == {torch.bfloat16}
    assert {c.dtype for c in model.optim_parameters()} == {torch.float32}
    losses = train(model, opt, make_data(20))
    assert losses[-1] < 0.7 * losses[0]


def test_kept_difference_argument_shapes_are_checked_before_the_opt_level():
    with pytest.raises(TypeError, match="models must be"):
        initialize((make_net(),), opt_level="O9")  # apex: the opt level's RuntimeError


def test_kept_difference_an_o2_resume_restores_the_optimizer_state_exactly():
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O2")
    train(model, opt, make_data(3))
    saved = opt.state_dict()
    momentum = [s["momentum_buffer"].clone() for s in opt.state.values()]
    net2 = make_net(seed=3, batchnorm=False)
    model2, opt2 = initialize(net2, sgd(net2.parameters()), opt_level="O2")
    opt2.load_state_dict(saved)
    restored = [s["momentum_buffer"] for s in opt2.state.values()]
    assert all(r.dtype == torch.float32 and torch.equal(r, m) for r, m in zip(restored, momentum))
    assert any(not torch.equal(m, m.half().float()) for m in momentum)  # apex would round these


def test_kept_difference_o2_static_one_accumulates_the_float32_parameters_grads():
    """apex's O2 with loss_scale=1.0 keeps only the last block's grads of float32 (BatchNorm)
    parameters (commit 20d00ab1); compat accumulates them like every other gradient."""

    def batchnorm_grad(blocks: int) -> torch.Tensor:
        net = make_net()
        model, opt = initialize(net, sgd(net.parameters()), opt_level="O2", loss_scale=1.0)
        x, y = make_data()[0]
        for _ in range(blocks):
            model.forward_backward(input_args=(x,), label=y, loss_fn=scaled_cross_entropy(amp.loss_scaler()))
        copy = dict(zip(net.parameters(), model.optim_parameters()))[net[1].weight]
        assert copy.dtype == net[1].weight.dtype == torch.float32
        return copy.grad.clone()

    once = batchnorm_grad(1)
    assert torch.equal(batchnorm_grad(2), 2 * once) and once.abs().sum() > 0


def test_loss_scaler_step_on_the_main_thread_runs_as_the_next_optimizer_job():
    net = make_net(batchnorm=False)
    model, opt = initialize(net, sgd(net.parameters()), opt_level="O2")
    scaler = amp.loss_scaler()
    seen = []
    opt.register_step_pre_hook(
        lambda o, a, k: seen.append((threading.current_thread().name, optim_stream.current_job()))
    )
    x, y = make_data()[0]
    for idle in (True, False):
        model.forward_backward(input_args=(x,), label=y, loss_fn=scaled_cross_entropy(scaler))
        gate = threading.Event()
        if not idle:
            blocker = optim_stream.launch(gate.wait)
            threading.Timer(0.05, gate.set).start()
        before = optim_stream.launched_seq()
        scaler.step(opt)
        thread, job = seen[-1]
        assert job is not None and job.seq == before + 1
        if idle:  # nothing queued: it runs on this thread, with no hop
            assert thread == threading.current_thread().name and job.inline
        else:  # queued behind the blocker, and run after it on the optimizer thread
            assert thread == optim_stream.THREAD_NAME and not job.inline and blocker.seq < job.seq
        opt.zero_grad()
        scaler.update()
