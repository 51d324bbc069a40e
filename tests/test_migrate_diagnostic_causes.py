"""Diagnostics name the statement that really blocks: a loss-scale read between the backward
and the update (RPM134 at ``get_scale()``, alone or in a step helper of another file), the
code of a weight write rather than the comment above it (RPM141); and a weight read through
``next(model.parameters())`` after the step is no gradient measure: it migrates (in the
default form one step stale inside the training loop, as every weight read there)."""

import pytest

from migrate.engine import migrate_source
from migrate.project import migrate_project
from script_runs import run_script

LOOP = """import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=64.0)
    g = torch.Generator().manual_seed(4)
    for step in range(5):
        x = torch.randn(8, 4, generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ((model(x).float() - x[:, :1]) ** 2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
STEP
        print(f"step {step} loss {loss.item()!r}")


main()
"""

WEIGHT_READ = """        scaler.step(optimizer)
        scaler.update()
        w = next(model.parameters()).detach().abs().sum().item()
        print("w", repr(w))"""

SKIP_ON_OVERFLOW = """        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if not scale > scaler.get_scale():
            scheduler.step()"""

CLAMP = """        scaler.step(optimizer)
        scaler.update()
        # weight clipping
        for p in model.parameters():
            p.data.clamp_(-0.5, 0.5)"""


def _line(source: str, text: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_weight_read_after_the_step_migrates(tmp_path):
    source = LOOP.replace("STEP", WEIGHT_READ)
    original = run_script(source, tmp_path, "original.py")
    exact = migrate_source(source, "main.py", exact=True)
    assert exact.status == "migrated"
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "main.py")
    assert default.status == "migrated"
    assert "synchronize" not in default.migrated
    again = migrate_source(default.migrated, "main.py")  # idempotent, and silent
    assert again.migrated == default.migrated and not again.diagnostics
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == original.count("step ") == 5


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "async"])
def test_a_scale_read_between_backward_and_update_is_named(exact):
    source = LOOP.replace("STEP", SKIP_ON_OVERFLOW)
    result = migrate_source(source, "main.py", exact=exact)
    assert result.migrated == source
    assert [(d.code, d.line) for d in result.diagnostics] == [("RPM134", _line(source, "scale = scaler.get_scale()"))]
    assert "`scale = scaler.get_scale()` reads the loss scale" in result.diagnostics[0].message


HELPER = """import torch


def train_step(model, optimizer, scaler, x, y, crit):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = crit(model(x).float(), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    SCALE_BEFORE
    scaler.update()
    skipped = SKIPPED
    return loss.item(), skipped
"""

CALLER = """import torch
import torch.nn as nn
from lib import train_step


def main():
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    for step in range(4):
        x = torch.randn(8, 4)
        print(train_step(model, optimizer, scaler, x, x[:, :1], nn.MSELoss()))


main()
"""


def test_a_step_helper_of_another_file_is_refused_at_its_scale_read():
    lib = HELPER.replace("SCALE_BEFORE", "scale = scaler.get_scale()").replace("SKIPPED", "scaler.get_scale() < scale")
    results = migrate_project({"lib.py": lib, "main.py": CALLER})
    assert not any(r.changed for r in results.values())
    assert [(d.code, d.line) for d in results["lib.py"].diagnostics] == [("RPM134", _line(lib, "scale = scaler"))]
    assert [(d.code, d.line) for d in results["main.py"].diagnostics] == [("RPM110", _line(CALLER, "from lib"))]
    assert "lib.py:10 (RPM134)" in results["main.py"].diagnostics[0].message
    plain = HELPER.replace("    SCALE_BEFORE\n", "").replace("SKIPPED", "False")  # the near miss migrates
    assert all(r.status == "migrated" for r in migrate_project({"lib.py": plain, "main.py": CALLER}).values())


def test_a_weight_write_is_quoted_by_its_code_not_the_comment_above_it():
    source = LOOP.replace("STEP", CLAMP)
    (diagnostic,) = migrate_source(source, "main.py").diagnostics
    assert diagnostic.code == "RPM141"
    assert diagnostic.message.startswith("`for p in model.parameters():` writes the weights of 'model'")


SKIP_SCHEDULER = """import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**30, growth_interval=1)
    g = torch.Generator().manual_seed(4)
    for step in range(6):
        x = torch.randn(8, 4, generator=g) * 1000
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = ((model(x).float() - x[:, :1]) ** 2).mean()
        optimizer.zero_grad()
        scale_before = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        SKIPPED
        if not skipped:
            scheduler.step()
        print(f"step {step} loss {loss.item()!r} skipped {skipped} lr {scheduler.get_last_lr()[0]!r}")


main()
"""

COMPARISONS = {
    "compared directly": "skipped = scaler.get_scale() < scale_before",
    "compared by name": "scale_after = scaler.get_scale()\n        skipped = not scale_before <= scale_after",
}


@pytest.mark.parametrize("skipped", COMPARISONS.values(), ids=COMPARISONS.keys())
def test_skipping_the_scheduler_on_overflow_is_refused_async_and_kept_exact(skipped, tmp_path):
    source = SKIP_SCHEDULER.replace("SKIPPED", skipped)
    default = migrate_source(source, "main.py")
    assert default.migrated == source
    assert [(d.code, d.line) for d in default.diagnostics] == [("RPM134", _line(source, "skipped = "))]
    assert "compares the loss scale across `scaler.update()`" in default.diagnostics[0].message
    original = run_script(source, tmp_path, "original.py")
    assert "skipped True" in original and "skipped False" in original  # the overflow is exercised
    exact = migrate_source(source, "main.py", exact=True)
    assert exact.status == "migrated"
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
