"""roundpipe.compat against an independent, plain-torch re-implementation of apex's amp rules.

The reference is the apex script as written, run on tests/fake_apex: ``apex.amp`` written
from shared/reference/apex_amp_behaviour.md (§1.2 the ``update_scale`` rule, §1.4-§1.5
unscaling and the stash tables, §1.6 step patching, §2 the ``scale_loss`` short cut, §4
state dicts) in plain torch with apex's Python arithmetic (no RoundPipe, no
roundpipe.compat code), so a difference in scales, skipped steps, losses, model weights or
master weights shows up bit for bit.

The compat side is the migrated loop: one ``forward_backward`` per apex ``scale_loss``
block, ``scaler.step`` inside ``model.step``, ``scaler.update()`` after it.
"""

from __future__ import annotations

import importlib.util
import pathlib
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import roundpipe.compat as amp
from compat_matrix.apex_column import fault_during_backward

STEPS = 8
Fault = Tuple[int, int, int]  # (step, micro-batch, loss id) whose gradient gets an inf


# ----------------------------------------------------------------------- the reference
def _load_reference_amp():
    """tests/fake_apex's ``apex.amp`` (apex's rules from the spec, plain torch), loaded under
    a private name so that nothing mistakes it for an installed apex."""
    path = pathlib.Path(__file__).parent / "fake_apex" / "apex" / "amp.py"
    spec = importlib.util.spec_from_file_location("_reference_apex_amp", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


reference_amp = _load_reference_amp()


@dataclass
class Config:
    """One apex configuration and the run around it."""

    opt_level: str = "O2"
    overrides: Dict = field(default_factory=dict)
    accumulate: int = 1
    num_losses: int = 1
    faults: Sequence[Fault] = ()
    window: int = 3
    loaded: Optional[Dict] = None  # an apex entry loaded (into every loss) before training
    min_loss_scale: Optional[float] = None
    max_loss_scale: float = 2.0**24
    batchnorm: bool = False  # O2 keeps its parameters fp32: apex's fp32-from-fp32 path


@dataclass
class Trace:
    scales: List[List[float]] = field(default_factory=list)  # per step, per loss, before it
    skipped: List[bool] = field(default_factory=list)
    losses: List[float] = field(default_factory=list)
    weights: List[torch.Tensor] = field(default_factory=list)
    masters: List[torch.Tensor] = field(default_factory=list)
    state: Dict = field(default_factory=dict)


def make_net(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    middle = [nn.BatchNorm1d(12)] if batchnorm else []
    return nn.Sequential(nn.Linear(6, 12), *middle, nn.Tanh(), nn.Linear(12, 2))


def make_batches(config: Config):
    generator = torch.Generator().manual_seed(3)
    return [
        [
            (torch.randn(8, 6, generator=generator), torch.randn(8, 2, generator=generator))
            for _ in range(config.accumulate)
        ]
        for _ in range(STEPS)
    ]


def loss_of(output, target, config: Config, loss_id: int):
    return F.mse_loss(output.float(), target) * (1.0 + loss_id) / config.accumulate


def blocks(config: Config, step: int, micro_batches):
    """``(loss id, x, y, fault)`` for every ``scale_loss`` block of one step, in order."""
    for micro, (x, y) in enumerate(micro_batches):
        for loss_id in range(config.num_losses):
            yield loss_id, x, y, "inf" if (step, micro, loss_id) in config.faults else None


def loaded_state(config: Config) -> Dict:
    """An apex state dict holding ``config.loaded`` for every loss."""
    return {f"loss_scaler{i}": dict(config.loaded) for i in range(config.num_losses)}


def initialize(amp_module, config: Config, scalers_of):
    """``amp_module.initialize`` (the reference's or roundpipe.compat's) for ``config``, then
    the window set and the state loaded as apex scripts do (``_scale_seq_len``,
    ``load_state_dict``). Returns the module, the model, the optimizer and ``scalers_of()``."""
    net = make_net(config.batchnorm)
    model, optimizer = amp_module.initialize(
        net,
        torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9),
        opt_level=config.opt_level,
        num_losses=config.num_losses,
        verbosity=0,
        min_loss_scale=config.min_loss_scale,
        max_loss_scale=config.max_loss_scale,
        **config.overrides,
    )
    scalers = scalers_of()
    for scaler in scalers:
        scaler._scale_seq_len = config.window
    if config.loaded is not None:
        amp_module.load_state_dict(loaded_state(config))
    return net, model, optimizer, scalers


def run_reference(config: Config) -> Trace:
    """The apex script, as written, on the reference amp."""
    net, model, optimizer, scalers = initialize(reference_amp, config, lambda: reference_amp._amp_state.loss_scalers)
    first = next(net.parameters())
    trace = Trace()
    for step, micro_batches in enumerate(make_batches(config)):
        trace.scales.append([s.loss_scale() for s in scalers])
        for loss_id, x, y, fault in blocks(config, step, micro_batches):
            with fault_during_backward(first, fault):
                loss = loss_of(model(x), y, config, loss_id)
                with reference_amp.scale_loss(loss, optimizer, loss_id=loss_id) as scaled:
                    scaled.backward()
        trace.skipped.append(optimizer._amp_stash.already_patched)
        optimizer.step()
        optimizer.zero_grad()
        trace.losses.append(loss.item())
        trace.weights.append(torch.cat([p.detach().float().flatten() for p in net.parameters()]))
        trace.masters.append(torch.cat([m.detach().flatten() for m in reference_amp.master_params(optimizer)]))
    trace.state = reference_amp.state_dict()
    return trace


# --------------------------------------------------------------------- roundpipe.compat
def run_compat(config: Config, is_async: bool = False) -> Trace:
    """The migrated loop on roundpipe.compat."""
    net, model, optimizer, scalers = initialize(
        amp, config, lambda: [amp.loss_scaler(i) for i in range(config.num_losses)]
    )
    first = next(net.parameters())
    trace = Trace()
    for step, micro_batches in enumerate(make_batches(config)):
        trace.scales.append([s.get_scale() for s in scalers])
        for loss_id, x, y, fault in blocks(config, step, micro_batches):
            scaler = scalers[loss_id]

            def loss_fn(out, target, s=scaler, k=loss_id):
                return s.scale(loss_of(out, target, config, k))

            with fault_during_backward(first, fault):
                loss = model.forward_backward(input_args=(x,), label=y, loss_fn=loss_fn)
            loss = loss / scaler.get_scale()
        moved = []

        def step_fn():
            before = [m.detach().clone() for m in amp.master_params(optimizer)]
            scalers[0].step(optimizer)
            moved.append(any(not torch.equal(a, b) for a, b in zip(before, amp.master_params(optimizer))))
            optimizer.zero_grad()

        model.step(step_fn, is_async=is_async)
        scalers[0].update(is_async=is_async)
        model.synchronize()
        trace.skipped.append(not moved[0])
        trace.losses.append(loss.item())
        trace.weights.append(torch.cat([p.detach().float().flatten() for p in net.parameters()]))
        trace.masters.append(torch.cat([m.detach().flatten() for m in model.optim_parameters()]))
    trace.state = dict(amp.state_dict())
    return trace


def assert_same(reference: Trace, ours: Trace, losses: bool = True) -> None:
    assert ours.scales == reference.scales
    assert ours.skipped == reference.skipped
    if losses:
        assert ours.losses == reference.losses
    for step, (a, b) in enumerate(zip(reference.weights, ours.weights)):
        assert torch.equal(a, b), f"model weights differ after step {step}"
    for step, (a, b) in enumerate(zip(reference.masters, ours.masters)):
        assert torch.equal(a, b), f"master weights differ after step {step}"
    assert ours.state == reference.state


# ---------------------------------------------------------- gradient accumulation (#16)
ACCUMULATION_LEVELS = [
    pytest.param("O2", {}, id="O2-fp16-model-fp32-masters"),
    pytest.param("O1", {"patch_torch_functions": False}, id="O1-fp32-model"),
    pytest.param("O2", {"master_weights": False}, id="O2-fp16-no-masters"),
    pytest.param("O3", {"loss_scale": "dynamic"}, id="O3-dynamic"),
]


@pytest.mark.parametrize("level, overrides", ACCUMULATION_LEVELS)
@pytest.mark.parametrize("accumulate", [2, 3])
@pytest.mark.parametrize("overflow_micro", [0, 1], ids=["overflow-first-micro", "overflow-second-micro"])
def test_accumulation_follows_apexs_per_block_unscale(level, overrides, accumulate, overflow_micro):
    config = Config(
        level,
        overrides,
        accumulate=accumulate,
        faults=[(2, overflow_micro, 0), (5, accumulate - 1 - overflow_micro, 0)],
    )
    reference = run_reference(config)
    assert reference.skipped[2] and reference.skipped[5]
    assert_same(reference, run_compat(config))


@pytest.mark.parametrize("overflow_micro", [0, 1])
def test_o2_accumulation_with_float32_batchnorm_parameters(overflow_micro):
    config = Config("O2", accumulate=2, batchnorm=True, faults=[(3, overflow_micro, 0)])
    assert_same(run_reference(config), run_compat(config))


def test_a_growth_inside_the_accumulation_window_changes_the_next_blocks_scale():
    config = Config("O2", accumulate=3, window=2, faults=[(3, 1, 0)])
    reference = run_reference(config)
    assert any(len(set(s)) == 1 for s in reference.scales)
    ours = run_compat(config)
    assert_same(reference, ours)
    assert ours.scales != [[2.0**16]] * STEPS  # it grew (within a step: 3 blocks, window 2)


def test_the_asynchronous_mode_keeps_the_accumulation_rule():
    """Same unscale and skip decisions; only the weights of each forward are one step old."""
    config = Config("O2", accumulate=2, faults=[(2, 0, 0), (5, 1, 0)])
    ours = run_compat(config, is_async=True)
    reference = run_reference(config)
    assert ours.scales == reference.scales and ours.skipped == reference.skipped
    assert ours.state == reference.state


# ----------------------------------------------------------------------------- bounds
@pytest.mark.parametrize(
    "min_loss_scale, max_loss_scale, loaded",
    [
        pytest.param(2.0**17, 2.0**24, None, id="floor-above-the-first-scale"),
        pytest.param(None, 2.0**10, {"loss_scale": 2.0**14, "unskipped": 0}, id="loaded-above-the-cap"),
        pytest.param(2.0**12, 2.0**24, {"loss_scale": 2.0**8, "unskipped": 1}, id="loaded-below-the-floor"),
        pytest.param(0.0, 2.0**24, None, id="falsy-floor-is-none"),
    ],
)
def test_bounds_apply_only_when_halving_or_growing(min_loss_scale, max_loss_scale, loaded):
    config = Config(
        "O2", min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, loaded=loaded, faults=[(1, 0, 0), (2, 0, 0)]
    )
    assert_same(run_reference(config), run_compat(config))


def test_roundpipe_gradscaler_keeps_torchs_clamp_at_every_update():
    from roundpipe import GradScaler

    param = nn.Parameter(torch.ones(1))
    param.grad = torch.ones(1)
    scaler = GradScaler(init_scale=4.0, min_scale=8.0, growth_interval=100)
    scaler.scale(torch.ones(()))
    scaler.unscale_(torch.optim.SGD([param], lr=0.1))
    scaler.update()
    assert scaler.get_scale() == 8.0  # no overflow, yet the floor applies: torch's clamp, kept


@pytest.mark.parametrize(
    "kwargs",
    [{"max_loss_scale": 0.0}, {"max_loss_scale": -1.0}, {"min_loss_scale": 2.0**20, "max_loss_scale": 2.0**10}],
)
def test_bounds_apex_accepts_but_compat_rejects(kwargs):
    with pytest.raises(ValueError):
        amp.initialize(make_net(), opt_level="O1", verbosity=0, **kwargs)


# ------------------------------------------------------------ per-loss scales (num_losses)
def test_each_loss_has_its_own_scale_and_a_step_skips_when_any_loss_overflowed():
    config = Config("O2", num_losses=2, faults=[(1, 0, 1), (3, 0, 0), (4, 0, 1)], window=2)
    reference = run_reference(config)
    assert reference.scales[2][0] != reference.scales[2][1]
    ours = run_compat(config)
    assert_same(reference, ours)
    assert list(ours.state) == ["loss_scaler0", "loss_scaler1"]


# ----------------------------------------------------------- static-scale bookkeeping
@pytest.mark.parametrize(
    "level, overrides",
    [
        pytest.param("O1", {"loss_scale": 128.0, "patch_torch_functions": False}, id="O1-static-128"),
        pytest.param("O2", {"loss_scale": 1.0}, id="O2-static-1-master-weights"),
        pytest.param("O3", {}, id="O3-short-cut"),
        pytest.param("O0", {}, id="O0-short-cut"),
    ],
)
def test_static_scale_counts_every_block_and_never_resets(level, overrides):
    config = Config(level, overrides, accumulate=2, window=3)
    reference = run_reference(config)
    ours = run_compat(config)
    assert_same(reference, ours)
    expected = 0 if level in ("O0", "O3") else 2 * STEPS  # the short cut never updates
    assert ours.state["loss_scaler0"]["unskipped"] == expected


@pytest.mark.parametrize(
    "level, overrides",
    [
        pytest.param("O3", {}, id="O3"),
        pytest.param("O0", {}, id="O0"),
        pytest.param("O1", {"loss_scale": 64.0, "patch_torch_functions": False}, id="O1-static"),
    ],
)
def test_a_loaded_scale_replaces_a_static_one_and_an_int_stays_int(level, overrides):
    config = Config(level, overrides, loaded={"loss_scale": 512, "unskipped": 5})
    reference = run_reference(config)
    ours = run_compat(config)
    assert_same(reference, ours)
    assert type(ours.state["loss_scaler0"]["loss_scale"]) is int
    assert ours.state["loss_scaler0"] == {"loss_scale": 512, "unskipped": 5 + STEPS}


def test_a_non_representable_static_scale_is_reported_as_given_and_trains_as_apex():
    config = Config("O2", {"loss_scale": 100.1})
    ours = run_compat(config)
    assert ours.state["loss_scaler0"]["loss_scale"] == 100.1
    assert amp.loss_scaler().get_scale() == 100.1
    assert_same(run_reference(config), ours, losses=False)  # loss*S/S is not the loss


def test_static_scale_skips_a_non_finite_step_unless_told_to_apply_it_as_apex():
    config = Config("O1", {"loss_scale": 128.0, "patch_torch_functions": False}, faults=[(2, 0, 0)])
    ours = run_compat(config)
    assert ours.skipped == [k == 2 for k in range(STEPS)]
    assert all(torch.isfinite(w).all() for w in ours.weights)

    net = make_net()
    model, optimizer = amp.initialize(
        net,
        torch.optim.SGD(net.parameters(), lr=0.05),
        opt_level="O1",
        loss_scale=128.0,
        patch_torch_functions=False,
        verbosity=0,
    )
    scaler = amp.loss_scaler()
    scaler.skip_static_overflow = False  # apex: a static scale never checks
    x, y = make_batches(config)[0][0]
    with fault_during_backward(net[0].weight, "inf"):
        model.forward_backward(input_args=(x,), label=y, loss_fn=lambda o, t: scaler.scale(F.mse_loss(o, t)))
    model.step(lambda: scaler.step(optimizer), is_async=False)
    scaler.update()
    assert not torch.isfinite(net[0].weight).all()  # the inf went into the weights


def test_a_closure_is_refused_where_apex_refuses_it():
    net = make_net()
    model, optimizer = amp.initialize(net, torch.optim.SGD(net.parameters(), lr=0.05), opt_level="O2", verbosity=0)
    with pytest.raises(RuntimeError, match="closure"):
        amp.loss_scaler().step(optimizer, lambda: None)  # master weights: apex's patched step
    net = make_net()
    model, optimizer = amp.initialize(
        net, torch.optim.SGD(net.parameters(), lr=0.05), opt_level="O1", patch_torch_functions=False, verbosity=0
    )
    calls = []
    amp.loss_scaler().step(optimizer, lambda: calls.append(1))  # O1: passed on to the optimizer
    assert calls == [1]


def test_the_stand_in_casts_as_apexs_o1_from_initialize_on_but_not_in_backward_or_step():
    """apex's O1 patches torch for the whole program (the stand-in: CPU autocast), except
    the backward kernels and the optimizer step, which apex runs with casts disabled."""
    net = make_net()
    model, optimizer = reference_amp.initialize(net, torch.optim.SGD(net.parameters(), lr=0.05), verbosity=0)
    seen = {}

    def record(where: str) -> None:
        seen[where] = torch.is_autocast_enabled("cpu")

    x, y = make_batches(Config())[0][0]
    record("before the forward")
    loss = F.mse_loss(model(x), y)
    net[0].weight.register_hook(lambda grad: record("backward"))
    with reference_amp.scale_loss(loss, optimizer) as scaled:
        scaled.backward()
    optimizer.register_step_pre_hook(lambda *_: record("step"))
    optimizer.step()
    seen["after the block"] = torch.is_autocast_enabled("cpu")
    assert seen == {"before the forward": True, "backward": False, "step": False, "after the block": True}
