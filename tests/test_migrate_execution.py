"""Migrated examples run: `--exact` migrations print exactly the original's numbers, default
(asynchronous) migrations run the same number of steps, and raising the microbatch count
keeps the loss (mean losses are divided by it)."""

import math
import pathlib
import re

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("amp_*.py"))
STEP = re.compile(r"^step (\d+) loss (-?\d+\.\d+)", re.M)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_exact_migration_prints_the_same_numbers(path, tmp_path):
    source = path.read_text()
    original = run_script(source, tmp_path, "original.py")
    exact = migrate_source(source, str(path), exact=True)
    assert exact.status == "migrated"
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, str(path))
    async_run = run_script(default.migrated, tmp_path, "default.py")
    assert len(STEP.findall(async_run)) == len(STEP.findall(original)) >= 6


@pytest.mark.parametrize("name", ["amp_basic.py", "amp_accumulation.py"])
def test_more_microbatches_keep_the_loss(name, tmp_path):
    source = (ROOT / "examples" / name).read_text()
    migrated = migrate_source(source, name, exact=True).migrated
    split = migrated.replace("NUM_MICROBATCH = 1 ", "NUM_MICROBATCH = 2 ", 1)
    assert split != migrated
    first = [float(v) for _, v in STEP.findall(run_script(migrated, tmp_path, "one.py"))][0]
    second = [float(v) for _, v in STEP.findall(run_script(split, tmp_path, "two.py"))][0]
    assert second == pytest.approx(first, rel=2e-3, abs=1e-5)


APEX_EXAMPLES = sorted((ROOT / "examples").glob("apex_*.py"))


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "async"])
@pytest.mark.parametrize("path", APEX_EXAMPLES, ids=[p.name for p in APEX_EXAMPLES])
def test_migrated_apex_examples_train_on_cpu_without_apex(path, exact, tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", [path.name])  # the argparse example reads its own argv
    result = migrate_source(path.read_text(), str(path), exact=exact)
    assert result.status == "migrated"
    assert not re.search(r"^\s*(from apex|import apex)", result.migrated, re.M)
    losses = [float(v) for _, v in STEP.findall(run_script(result.migrated, tmp_path, path.name))]
    assert len(losses) >= 6
    assert all(math.isfinite(v) for v in losses)
    assert len(set(losses)) > 1  # the weights moved between steps


LOSS_OUTSIDE_AUTOCAST = """
import torch
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    for step in range(8):
        x, y = torch.randn(12, 8), torch.randint(0, 3, (12,))
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)  # outside autocast
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
"""


def test_loss_computed_outside_autocast_stays_outside_and_matches(tmp_path):
    migrated = migrate_source(LOSS_OUTSIDE_AUTOCAST, "outside.py", exact=True)
    assert migrated.status == "migrated"
    assert 'torch.autocast(device_type="cpu", enabled=False)' in migrated.migrated
    original = run_script(LOSS_OUTSIDE_AUTOCAST, tmp_path, "original.py")
    assert run_script(migrated.migrated, tmp_path, "migrated.py") == original
    assert len(STEP.findall(original)) == 8


CASES = ROOT / "tests" / "migrate_cases"
RUNNABLE_CASES = ["next_batch_fetch.py"]


@pytest.mark.parametrize("name", RUNNABLE_CASES)
def test_migrated_fixture_prints_the_originals_numbers(name, tmp_path):
    """Statements kept on the main thread (bookkeeping, a next-batch fetch) run where they
    ran; under --exact every printed number, the logged loss included, is the original's."""
    source = (CASES / name).read_text()
    original = run_script(source, tmp_path, "original.py")
    exact = migrate_source(source, name, exact=True)
    assert exact.status == "migrated"
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = run_script(migrate_source(source, name).migrated, tmp_path, "default.py")
    assert len(STEP.findall(default)) == len(STEP.findall(original)) >= 6


def test_logged_loss_stays_finite_when_loss_times_scale_overflows(tmp_path):
    """loss * scale overflows float32 in the first steps of next_batch_fetch (scale 2**127):
    the migrated script logs the real loss, never inf, in both modes."""
    source = (CASES / "next_batch_fetch.py").read_text()
    for exact in (True, False):
        printed = run_script(migrate_source(source, exact=exact).migrated, tmp_path, "overflow.py")
        losses = [float(v) for _, v in STEP.findall(printed)]
        assert losses and all(math.isfinite(v) for v in losses)
        assert "scale 8.50705917" in printed  # a step overflowed: 2**127 was halved


def test_lr_written_on_the_main_thread_does_not_race_with_the_step(tmp_path, monkeypatch):
    """lr_schedule_by_hand writes the lr right after `model.step`. A slow optimizer step
    records the lr it used: the default (asynchronous) migration must use the original's lr
    at every step (without an ordering the main thread's write lands in the running step)."""
    import time

    import torch

    used = []
    plain_step = torch.optim.SGD.step

    def slow_step(self, closure=None):
        time.sleep(0.02)
        used.append(self.param_groups[0]["lr"])
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slow_step)
    source = (CASES / "lr_schedule_by_hand.py").read_text()
    run_script(source, tmp_path, "original.py")
    original, used[:] = list(used), []
    migrated = migrate_source(source, "lr_schedule_by_hand.py")
    assert migrated.status == "migrated"
    run_script(migrated.migrated, tmp_path, "default.py")
    assert used == original and len(original) == 8
