"""A step chosen by a gradient norm measured in it (issue 10, shapes 7 and 9): the ``if``
reading the norm moves into the step function with the measure, ``scaler.update()`` ending
its branches runs once after ``model.step``, and counters/logging in its branches reach the
main thread. The migrated programs print the original's numbers under ``--exact``, the
default migration runs the same steps, and what cannot move is refused untouched."""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import math

import torch
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 6))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    skipped = 0
    for it in range(7):
        x = torch.randn(10, 6, generator=gen)
        if it == 2:
            x[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), x.tanh())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
DECISION
        optimizer.zero_grad()
        print(f"step {it} loss {loss.item()!r} norm {grad_norm.item()!r}")
    print(f"final scale {scaler.get_scale()!r} skipped {skipped}")


main()
"""

DECISIONS = {
    "both_branches_step_and_update": (
        "        if not torch.isfinite(grad_norm):\n"
        '            print(f"norm {grad_norm}: skipping")\n'
        "            skipped += 1\n"
        "            scaler.step(optimizer)\n"
        "            scaler.update()\n"
        "        else:\n"
        "            scaler.step(optimizer)\n"
        "            scaler.update()"
    ),
    "step_only_when_finite": (
        "        if torch.isfinite(grad_norm):\n            scaler.step(optimizer)\n        scaler.update()"
    ),
    "counter_else_step": (
        "        if not math.isfinite(grad_norm.item()):\n"
        "            skipped += 1\n"
        "        else:\n"
        "            scaler.step(optimizer)\n"
        "        scaler.update()"
    ),
    "elif_chain": (
        "        if torch.isfinite(grad_norm):\n"
        "            scaler.step(optimizer)\n"
        "            scaler.update()\n"
        "        elif math.isnan(grad_norm.item()):\n"
        "            skipped += 1\n"
        "            scaler.update()\n"
        "        else:\n"
        "            scaler.update()"
    ),
}


@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_a_step_chosen_by_the_norm_prints_the_originals_numbers(decision, tmp_path):
    source = SCRIPT.replace("DECISION", DECISIONS[decision])
    original = run_script(source, tmp_path, "original.py")
    assert "norm nan" in original and original.count("step ") == 7
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    step_function = exact.migrated[exact.migrated.index("def _step_fn") : exact.migrated.index("model.step(")]
    assert "scaler.update()" not in step_function
    assert DECISIONS[decision].splitlines()[0].strip() in step_function  # the `if` moved with the measure
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py", exact=False)
    assert "model.step(_step_fn, is_async=False)" in default.migrated  # the norm is read after the step
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == 7


def test_a_decision_without_main_thread_work_keeps_the_step_asynchronous():
    source = SCRIPT.replace("DECISION", DECISIONS["step_only_when_finite"]).replace(
        ' norm {grad_norm.item()!r}")', '")'
    )
    result = migrate_source(source, "train.py", exact=False)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert "model.step(_step_fn)\n" in result.migrated


@pytest.mark.parametrize(
    "decision,blocker",
    [
        ("        if grad_norm > 50.0:\n            optimizer.zero_grad()\n            continue", "a `continue`"),
        ("        if not torch.isfinite(grad_norm): break", "a `break`"),
        ('        if not torch.isfinite(grad_norm):\n            raise FloatingPointError("nan")', "a `raise`"),
        (
            "        if not torch.isfinite(grad_norm):\n"
            "            for p in model.parameters():\n"
            "                print(p)",
            "a `for` block",
        ),
        (
            "        if torch.isfinite(grad_norm):\n            scaler.step(optimizer)\n            scaler.update()",
            "`scaler.update()` in only some of its branches",
        ),
    ],
    ids=["continue", "break", "raise", "loop", "update_in_one_branch"],
)
def test_what_cannot_move_into_the_step_function_is_refused_naming_it(decision, blocker):
    body = (
        decision
        if "scaler.step" in decision
        else decision + "\n        scaler.step(optimizer)\n        scaler.update()"
    )
    source = SCRIPT.replace("DECISION", body)
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == ["RPM135"]
    assert blocker in result.diagnostics[0].message and "grad_norm" in result.diagnostics[0].message
