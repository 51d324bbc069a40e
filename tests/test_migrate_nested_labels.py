"""The label of a step nested in an ``if`` or a ``with`` block of the loop body (assigned in
the loop body before that block) is handed to ``forward_backward`` as ``label=``, so each
microbatch's loss reads its own slice: with ``NUM_MICROBATCH = 2`` the migrated program runs
and keeps the loss; at 1, --exact prints the original's numbers."""

import re

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

STEP = re.compile(r"^step (\d+) loss (-?\d+\.\d+(?:e-?\d+)?)", re.M)

HEAD = """import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scaler = SCALER
    g = torch.Generator().manual_seed(3)
    for step in range(5):
        x = torch.randn(16, 4, generator=g)
        y = torch.randint(0, 2, (16,), generator=g)
"""

STEP_IN_IF = (
    HEAD.replace("SCALER", 'torch.amp.GradScaler("cpu") if USE_AMP else None').replace(
        "\n\n\ndef main", "\nUSE_AMP = True\n\n\ndef main"
    )
    + """\
        optimizer.zero_grad()
        if scaler is not None:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = model(x)
                loss = nn.functional.cross_entropy(out, y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)
            loss.backward()
            optimizer.step()
        print(f"step {step} loss {loss.item()!r} acc {(out.argmax(1) == y).float().mean().item()!r}")


main()
"""
)

BACKWARD_IN_AUTOCAST = (
    HEAD.replace("SCALER", 'torch.amp.GradScaler("cpu", init_scale=512.0)')
    + """\
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = nn.functional.cross_entropy(out, y)  # the loss
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")


main()
"""
)

PROGRAMS = {"step in an if": STEP_IN_IF, "backward in autocast": BACKWARD_IN_AUTOCAST}


@pytest.mark.parametrize("source", PROGRAMS.values(), ids=PROGRAMS.keys())
def test_a_nested_step_hands_its_label_and_splits_into_microbatches(source, tmp_path):
    original = run_script(source, tmp_path, "original.py")
    migrated = migrate_source(source, "main.py", exact=True)
    assert migrated.status == "migrated"
    assert "label=y" in migrated.migrated
    assert run_script(migrated.migrated, tmp_path, "exact.py") == original
    split = migrated.migrated.replace("NUM_MICROBATCH = 1 ", "NUM_MICROBATCH = 2 ", 1)
    assert split != migrated.migrated
    halves = [float(v) for _, v in STEP.findall(run_script(split, tmp_path, "two.py"))]
    losses = [float(v) for _, v in STEP.findall(original)]
    assert len(halves) == len(losses) == 5
    assert halves[0] == pytest.approx(losses[0], rel=2e-3, abs=1e-5)
