"""The torch two-path backward split (issue 10, shape 4; migrate.torch_two_path): the flag
picks the backward, then a two-path step under gradient accumulation picks the optimizer
step again, measuring a norm the loop prints. Both paths of the migrated program print the
original's numbers under --exact and as many steps by default, in the fused form (the test
is a plain read) and in the autograd form (the test calls a function)."""

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
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2) if use_amp else None
    gen = torch.Generator().manual_seed(5)
    accum = 2
    for i in range(7):
        x, y = torch.randn(10, 6, generator=gen) * 4, torch.randint(0, 3, (10,), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = F.cross_entropy(model(x).float(), y)
        loss = loss / accum
        if scaler is not None:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if (i + 1) % accum == 0:
            if scaler is None:
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                optimizer.step()
            else:
                scaler.unscale_(optimizer)
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
                scaler.step(optimizer)
                scaler.update()
            optimizer.zero_grad()
            print(f"norm {norm.item()!r}")
        print(f"step {i} loss {loss.item()!r}")
    if hasattr(model, "synchronize"):
        model.synchronize()
    weights = sum(p.sum().item() for p in model.parameters())
    print(f"weights {weights!r} final scale {scaler.get_scale() if scaler is not None else None!r}")


main(USE_AMP)
"""

#: the split's test calls a function: it cannot move into a loss function
CALLED_TEST = SCRIPT.replace(
    "        if scaler is not None:\n            scaler.scale",
    "        if scaling(scaler):\n            scaler.scale",
).replace("def main(use_amp):\n", "def scaling(scaler):\n    return scaler is not None\n\n\ndef main(use_amp):\n")

STEP = re.compile(r"^step ", re.M)


@pytest.mark.parametrize("use_amp", [True, False], ids=["amp", "plain"])
@pytest.mark.parametrize("script,fused", [(SCRIPT, True), (CALLED_TEST, False)], ids=["fused", "autograd"])
def test_both_paths_of_a_split_backward_keep_their_numbers(script, fused, use_amp, tmp_path):
    source = script.replace("USE_AMP", repr(use_amp))
    original = run_script(source, tmp_path, "original.py")
    assert len(STEP.findall(original)) == 7
    for exact in (True, False):
        result = migrate_source(source, "train.py", exact=exact)
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert ("forward_backward(" in result.migrated) is fused
        assert "if scaler is not None:\n                scaler.update()" in result.migrated
        migrated = run_script(result.migrated, tmp_path, f"migrated_{exact}.py")
        if exact:
            assert migrated == original
        else:
            assert len(STEP.findall(migrated)) == len(STEP.findall(original))


def test_a_step_whose_plain_branch_does_other_work_is_left_untouched():
    source = SCRIPT.replace(
        "                optimizer.step()\n", "                optimizer.step()\n                print(norm)\n"
    )
    result = migrate_source(source, "train.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM135"]
    assert "`print(norm)`" in result.diagnostics[0].message
