"""Each mixed-precision example runs on its own, prints per-step losses, and is deterministic."""

import re
from pathlib import Path

import pytest

from script_runs import run_python

REPO_ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = [
    "amp_basic.py",
    "amp_accumulation.py",
    "amp_clipping.py",
    "amp_legacy_cuda.py",
    "amp_train_function.py",
    "amp_outputs_used.py",
    "amp_trainer_class.py",
]

STEP_LINE = re.compile(r"^step \d+ loss -?\d+\.\d{6}")
ALLOWED_OTHER = re.compile(r"^(eval |saved|loaded)")


def _run(name, fresh=False):
    return run_python([Path("examples") / name], cwd=REPO_ROOT, timeout=60, fresh=fresh)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_and_is_deterministic(name):
    first = _run(name)
    assert first.returncode == 0, f"{name} failed:\n{first.stderr}"

    lines = first.stdout.splitlines()
    step_lines = [line for line in lines if STEP_LINE.match(line)]
    assert len(step_lines) >= 6, f"{name} printed too few step lines:\n{first.stdout}"
    stray = [line for line in lines if not STEP_LINE.match(line) and not ALLOWED_OTHER.match(line)]
    assert not stray, f"{name} printed unexpected lines: {stray}"

    second = _run(name, fresh=True)  # a new interpreter: its own hash seed and torch seed
    assert second.returncode == 0, f"{name} failed on the second run:\n{second.stderr}"
    assert second.stdout == first.stdout, f"{name} is not deterministic"
