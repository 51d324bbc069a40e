"""apex's pieces beside amp (issue 10, shape 12): fused optimizers, SyncBN, DDP under a guard
and the function-casting API, migrated and run.

Scripts run as written on tests/fake_apex (apex's documented rules; O1 casts the forward with
CPU autocast there, roundpipe.compat's analogue) and as ``roundpipe-migrate --exact`` output:
the printed numbers are identical. The semantics of :mod:`roundpipe.compat.functions` are
checked against apex's rules directly.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import runpy
import sys

import pytest
import torch

import roundpipe.compat
from migrate.engine import migrate_source
from roundpipe.compat import functions

FAKE_APEX = pathlib.Path(__file__).parent / "fake_apex"
TANH = torch.tanh  # torch.tanh before any registration wrapped it

SCRIPT = """
import os

import torch
import torch.nn as nn
from apex import amp
from apex.optimizers import OPTIMIZER
from apex.parallel import DistributedDataParallel
from apex.parallel import convert_syncbn_model


@amp.float_function
def loss_in_float(logits, targets):
    return (torch.sigmoid(logits) - targets).pow(2).mean()


def main():
    torch.manual_seed(0)
    amp.register_float_function(torch, "tanh")
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    model = convert_syncbn_model(model)
    optimizer = OPTIMIZER(model.parameters(), ARGUMENTS)
    model, optimizer = amp.initialize(model, optimizer, opt_level="LEVEL", verbosity=0)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        model = DistributedDataParallel(model)
    generator = torch.Generator().manual_seed(3)
    for step in range(6):
        x = torch.randn(16, 6, generator=generator)
        y = torch.rand(16, 1, generator=generator)
        out = model(x)
        loss = loss_in_float(out, y) + 0.1 * torch.tanh(out).mean()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
"""

VARIANTS = {
    "fused-adam-O1": ("FusedAdam", "3e-3, weight_decay=0.01", "O1"),
    "fused-adam-l2-O2": ("FusedAdam", "lr=3e-3, adam_w_mode=False, weight_decay=0.01", "O2"),
    "fused-sgd-O1": ("FusedSGD", "0.05, 0.9, nesterov=True, set_grad_none=True", "O1"),
}


def _script(variant: str) -> str:
    optimizer, arguments, level = VARIANTS[variant]
    return SCRIPT.replace("OPTIMIZER", optimizer).replace("ARGUMENTS", arguments).replace("LEVEL", level)


@pytest.fixture
def fake_apex(monkeypatch):
    """tests/fake_apex importable; torch's functions and compat's casting state restored."""
    monkeypatch.syspath_prepend(str(FAKE_APEX))
    for name in [n for n in sys.modules if n == "apex" or n.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(torch, "tanh", TANH)
    monkeypatch.setattr(functions, "_active", False)
    monkeypatch.setattr(functions, "_registered", [])


def _run(source: str, path: pathlib.Path, main: bool = True) -> str:
    path.write_text(source + ("\nmain()\n" if main else ""))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="script")
    return out.getvalue()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_exact_migration_prints_the_apex_scripts_numbers(variant, fake_apex, tmp_path, monkeypatch):
    source = _script(variant)
    original = _run(source, tmp_path / "original.py")
    assert original.count("\nstep ") == 5
    result = migrate_source(source, "script.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "apex" not in result.migrated.replace("apex DDP", "")
    monkeypatch.setattr(torch, "tanh", TANH)  # the original registered its own wrapper
    assert _run(result.migrated, tmp_path / "migrated.py") == original


@pytest.mark.parametrize(
    "line", ["@roundpipe.compat.float_function\n", '    roundpipe.compat.register_float_function(torch, "tanh")\n']
)
def test_the_numbers_depend_on_each_cast_it_keeps(line, fake_apex, tmp_path, monkeypatch):
    """The test above can fail: without either cast to float32 (of O1's bfloat16 outputs)
    the loss differs, so the migrated decorator and registration are what keep the numbers."""
    migrated = migrate_source(_script("fused-adam-O1"), "script.py", exact=True).migrated
    kept = _run(migrated, tmp_path / "kept.py")
    monkeypatch.setattr(torch, "tanh", TANH)
    monkeypatch.setattr(functions, "_registered", [])
    assert line in migrated
    assert _run(migrated.replace(line, ""), tmp_path / "dropped.py") != kept


def test_the_optimizers_and_batchnorm_become_torchs(fake_apex):
    migrated = migrate_source(_script("fused-sgd-O1"), "script.py", exact=True).migrated
    assert "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True, foreach=True)" in migrated
    assert "model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)" in migrated
    adam = migrate_source(_script("fused-adam-l2-O2"), "script.py", exact=True).migrated
    assert "torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=0.01, fused=True)" in adam


def test_the_guarded_apex_ddp_stops_a_multi_process_run_and_keeps_the_single_one(fake_apex, tmp_path, monkeypatch):
    migrated = migrate_source(_script("fused-adam-O1"), "script.py", exact=True).migrated
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="RoundPipe trains in one process"):
        _run(migrated, tmp_path / "two.py")
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _run(migrated, tmp_path / "one.py").count("step ") == 6


@pytest.mark.parametrize(
    "arguments, refused",
    [
        ("lr=1e-3, bias_correction=False", "bias_correction=False"),
        ("lr=1e-3, amsgrad=True", "amsgrad=True"),
        ("lr=1e-3, adam_w_mode=flag", "adam_w_mode"),
        ("lr=1e-3, master_weights=True", "master_weights=True"),
        ("*groups", "*args"),
    ],
)
def test_fused_adam_arguments_without_a_torch_meaning_are_refused(arguments, refused):
    source = _script("fused-adam-O1").replace("model.parameters(), 3e-3, weight_decay=0.01", arguments)
    result = migrate_source(source, "script.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM201"] and refused in result.diagnostics[0].message


def test_lamb_and_channel_last_syncbn_are_refused_by_name():
    lamb = _script("fused-adam-O1").replace("FusedAdam", "FusedLAMB")
    assert "torch has no such optimizer" in migrate_source(lamb, "s.py").diagnostics[0].message
    channel_last = _script("fused-adam-O1").replace(
        "convert_syncbn_model(model)", "convert_syncbn_model(model, None, True)"
    )
    assert "channel_last" in migrate_source(channel_last, "s.py").diagnostics[0].message


# ------------------------------------------------------- roundpipe.compat.functions
def test_function_casts_apply_under_o1_only(fake_apex):
    seen = []
    record = functions.float_function(lambda *a, **k: seen.append([a[0].dtype, a[1], k["w"].dtype]))
    half = torch.ones(2, dtype=torch.bfloat16)
    record(half, 3, w=half)
    net = torch.nn.Linear(2, 2)
    roundpipe.compat.initialize(net, opt_level="O2", verbosity=0)
    record(half, 3, w=half)
    roundpipe.compat.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    record(half, 3, w=half)
    assert seen == [[torch.bfloat16, 3, torch.bfloat16]] * 2 + [[torch.float32, 3, torch.float32]]
    low = functions.half_function(lambda t: t.dtype)
    assert low(torch.ones(1)) == torch.bfloat16  # CPU: O1's low-precision type


def test_promote_widens_mixed_precision_only(fake_apex):
    roundpipe.compat.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    dtypes = functions.promote_function(lambda *tensors: [t.dtype for t in tensors])
    low, full = torch.ones(1, dtype=torch.bfloat16), torch.ones(1)
    assert dtypes(low, low) == [torch.bfloat16] * 2
    assert dtypes(low, full) == [torch.float32] * 2
    with pytest.raises(NotImplementedError):
        dtypes(low, full, torch.ones(1, dtype=torch.float64))


def test_registrations_apply_at_the_next_o1_initialize(fake_apex):
    with pytest.raises(ValueError, match="No function named nothing"):
        roundpipe.compat.register_float_function(torch, "nothing")
    roundpipe.compat.register_float_function(torch, "tanh")
    low = torch.ones(1, dtype=torch.bfloat16)
    assert torch.tanh(low).dtype == torch.bfloat16  # not applied yet
    roundpipe.compat.initialize(torch.nn.Linear(2, 2), opt_level="O1", verbosity=0)
    assert torch.tanh(low).dtype == torch.float32


# ------------------------------------------------- amp.initialize results held on self
LEARNER = """
import torch
from apex import amp


class Learner:
    def __init__(self):
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O2", verbosity=0)

    def fit(self, x, y):
        self.optimizer.zero_grad()
        out = self.model(x)
        loss = (out - y).pow(2).mean()
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        self.optimizer.step()
        return loss.item()

    def weights(self):
        self.model.eval()
        return sum(v.float().sum().item() for v in self.model.state_dict().values())


def main():
    torch.manual_seed(0)
    learner = Learner()
    generator = torch.Generator().manual_seed(5)
    for step in range(5):
        x, y = torch.randn(8, 4, generator=generator), torch.randn(8, 1, generator=generator)
        print(f"step {step} loss {learner.fit(x, y)!r} weights {learner.weights()!r}")
"""


def test_a_trainer_holding_amps_results_on_self_migrates_to_the_same_numbers(fake_apex, tmp_path):
    original = _run(LEARNER, tmp_path / "original.py")
    exact = migrate_source(LEARNER, "learner.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert (
        "        self.model.synchronize()\n        self.model.eval()\n"
        "        return sum(v.float().sum().item() for v in self.model.model.state_dict().values())"
    ) in exact.migrated
    assert _run(exact.migrated, tmp_path / "exact.py") == original
    lagged = migrate_source(LEARNER, "learner.py").migrated
    assert _run(lagged, tmp_path / "lagged.py").count("step ") == original.count("step ")
    assert migrate_source(exact.migrated, "learner.py", exact=True).migrated == exact.migrated


@pytest.mark.parametrize(
    "change, named",
    [
        (
            ("learner.fit(x, y)!r}", "learner.fit(x, y)!r} lr {learner.optimizer.param_groups[0]['lr']}"),
            "learner.optimizer",
        ),
        (("        self.model.eval()\n", "        print(self.optimizer.param_groups)\n"), "self.optimizer"),
        (("amp.initialize(self.model, self.optimizer,", "amp.initialize(self.model, [self.optimizer],"), "self.model"),
        (("    def weights(self):\n", "    def weights(self):\n        fn = lambda: self.model\n"), "self.model"),
    ],
    ids=["used-through-another-object", "other-use-in-the-class", "not-rebound-in-place", "nested-function"],
)
def test_attribute_uses_that_are_not_followed_are_refused_by_name(change, named):
    source = LEARNER.replace(*change)
    assert source != LEARNER
    result = migrate_source(source, "learner.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM201"], [d.format() for d in result.diagnostics]
    assert named in result.diagnostics[0].message


MEASURED_NORM = """
import torch
import torch.nn as nn
from apex import amp


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    criterion = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        x, y = torch.randn(4, 8, generator=gen), torch.randint(0, 3, (4,), generator=gen)
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
        print("step", step, repr(loss.item()), "gn", repr(float(gn)))
"""


def test_a_logged_master_params_norm_moves_into_the_step_and_prints_apexs_numbers(fake_apex, tmp_path):
    """``gn = clip_grad_norm_(amp.master_params(optimizer), ...)`` read after the step (review
    S2, a1b): measured in the step function on unscaled gradients, as apex measured it."""
    result = migrate_source(MEASURED_NORM, "train.py", exact=True)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "unscale_(optimizer)\n            gn = torch.nn.utils.clip_grad_norm_(" in result.migrated
    original = _run(MEASURED_NORM, tmp_path / "original.py")
    assert _run(result.migrated, tmp_path / "exact.py") == original and original.count("gn") == 4


def test_a_statement_between_the_clipping_and_the_step_is_named_as_the_blocker():
    """A plain statement between the master-params clip and ``optimizer.step()`` (review S2,
    a1g) ends the optimizer statements: refused with RPM106 naming it, not a false RPM107."""
    source = MEASURED_NORM.replace("        gn = torch.nn", "        torch.nn").replace(
        "        optimizer.step()\n", "        gn = 0.0\n        optimizer.step()\n"
    )
    result = migrate_source(source, "train.py", exact=True)
    assert [d.code for d in result.diagnostics] == ["RPM106"] and result.migrated == source
    assert "they stop at line 21 (`gn = 0.0`" in result.diagnostics[0].format()


def test_a_second_scale_loss_block_is_refused_as_a_second_loss():
    """``num_losses=2``: two ``scale_loss`` blocks in one step (review S2, a3) are refused
    with RPM130 for the second loss, not a false RPM131 about a forward in the first block."""
    source = MEASURED_NORM.replace(
        "            scaled_loss.backward()\n",
        "            scaled_loss.backward()\n"
        "        with amp.scale_loss(loss * 0.5, optimizer, loss_id=1) as scaled_loss:\n"
        "            scaled_loss.backward()\n",
    ).replace("verbosity=0", "num_losses=2, verbosity=0")
    result = migrate_source(source, "train.py", exact=True)
    second = [d for d in result.diagnostics if d.line == 20]  # the first block's step: RPM106
    assert [d.code for d in second] == ["RPM130"] and result.migrated == source
    assert "a second amp.scale_loss block" in second[0].message
    assert "RPM131" not in [d.code for d in result.diagnostics]
