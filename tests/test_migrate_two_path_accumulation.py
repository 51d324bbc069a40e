"""Gradient accumulation on both paths of a two-path step (issue 10, shapes 4 and 6;
migrate.same_condition): the plain path steps under the same condition as the AMP path. The
migrated program prints the original's numbers under --exact on both paths, and as many
steps by default."""

import re

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import torch
import torch.nn.functional as F


def main(use_amp):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
    gen = torch.Generator().manual_seed(5)
    accum = 2
    for i in range(7):
        x, y = torch.randn(10, 6, generator=gen) * 4, torch.randint(0, 3, (10,), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = F.cross_entropy(model(x).float(), y) / accum
        if use_amp:
            scaler.scale(loss).backward()
            if (i + 1) % accum == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
        else:
            loss.backward()
            if (i + 1) % accum == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
                optimizer.zero_grad()
        print(f"step {i} loss {loss.item()!r}")
    if hasattr(model, "synchronize"):
        model.synchronize()
    print(f"weights {sum(p.sum().item() for p in model.parameters())!r} final scale {scaler.get_scale()!r}")


main(USE_AMP)
"""

STEP = re.compile(r"^step ", re.M)


@pytest.mark.parametrize("use_amp", [True, False], ids=["amp", "plain"])
def test_both_paths_step_under_the_same_condition(use_amp, tmp_path):
    source = SCRIPT.replace("USE_AMP", repr(use_amp))
    original = run_script(source, tmp_path, "original.py")
    assert original.count("step ") == 7
    for exact in (True, False):
        result = migrate_source(source, "train.py", exact=exact)
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert result.migrated.count(".step(_step_fn") == 2
        migrated = run_script(result.migrated, tmp_path, f"migrated_{exact}.py")
        if exact:
            assert migrated == original
        else:
            assert len(STEP.findall(migrated)) == len(STEP.findall(original))


def test_a_zero_grad_before_the_plain_backward_keeps_the_refusal():
    source = SCRIPT.replace(
        "            loss.backward()\n", "            optimizer.zero_grad()\n            loss.backward()\n"
    )
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM136"]
