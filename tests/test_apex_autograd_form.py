"""apex steps in RoundPipe's autograd form (rules/apex_autograd_form.py): work between the
forward and ``amp.scale_loss`` that must stay on the main thread. Each program runs as
written on tests/fake_apex and as ``roundpipe-migrate --exact`` output on roundpipe.compat:
the printed numbers are identical, O1 and O2; the default migration runs the same steps.

Batch 2 has targets 1e34 times larger, and the loss is multiplied by the targets' size: the
loss (about 1e34) is finite, its gradients times the scale are not (float32 in O1, float16
in O2), so the block overflows, the step is skipped and the scale halves. Batch 4 has NaN
inputs: its loss is NaN (the guards below see it; where no guard skips it, the block's
overflow skips the step).
"""

from __future__ import annotations

import pathlib
import re
from typing import Dict

import pytest

from migrate.engine import migrate_source
from test_migrate_projects import run_program

PROGRAM = """import math

import torch
from apex import amp


def criterion(out, y):
    size = y.abs().max()
    return torch.nn.functional.mse_loss(out, y / size) * size


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="LEVEL", verbosity=0)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=generator), torch.randn(16, 2, generator=generator)) for _ in range(7)]
    data[2] = (data[2][0], data[2][1] * 1e34)
    data[4] = (data[4][0] * float("nan"), data[4][1])
    running = 0.0
    for i, (x, y) in enumerate(data):
BODY
        weight = next(model.parameters()).float().sum().item()
        print(f"step {i} loss {loss.item():.10f} weight {weight:.10f} running {running:.6f}")
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']}")


if __name__ == "__main__":
    main()
"""

_BLOCK = """        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
"""

#: the loop bodies: forward, work that needs the loss on the main thread, the block, the step
BODIES: Dict[str, str] = {
    "nan-guard-continue": """        loss = criterion(model(x), y)
        if not math.isfinite(loss.item()):
            print(f"skipping batch {i}: loss {loss.item()}")
            continue
        optimizer.zero_grad()
"""
    + _BLOCK
    + "        optimizer.step()\n",
    "nan-guard-zeroes-and-skips": """        loss = criterion(model(x), y)
        if not torch.isfinite(loss):
            print(f"step {i}: loss is not finite, skipping the batch")
            optimizer.zero_grad()
            continue
"""
    + _BLOCK
    + "        optimizer.step()\n        optimizer.zero_grad()\n",
    "nan-guard-raise": """        loss = criterion(model(x), y)
        if i != 4 and not torch.isfinite(loss):
            raise FloatingPointError(f"loss is {loss.item()} at step {i}")
"""
    + _BLOCK
    + "        optimizer.step()\n        optimizer.zero_grad()\n",
    "loss-dict-summed-and-logged": """        out = model(x)
        losses = {"mse": criterion(out, y), "l1": torch.nn.functional.l1_loss(out, y)}
        loss = sum(losses.values())
        running += loss.item() if math.isfinite(loss.item()) else 0.0
        print({name: round(value.item(), 6) for name, value in losses.items()})
"""
    + _BLOCK
    + "        optimizer.step()\n        optimizer.zero_grad()\n",
    "if-rescales-the-loss": """        loss = criterion(model(x), y)
        if i < 3:
            loss = loss * (i + 1) / 3  # warm-up
"""
    + _BLOCK
    + "        optimizer.step()\n        optimizer.zero_grad()\n",
    "loss-over-several-model-calls": """        half = x.shape[0] // 2
        loss = criterion(model(x[:half]), y[:half]) + 0.5 * criterion(model(x[half:]), y[half:])
"""
    + _BLOCK
    + "        optimizer.step()\n        optimizer.zero_grad()\n",
    "clip-on-master-params": """        loss = criterion(model(x), y)
        if math.isnan(loss.item()):
            continue
"""
    + _BLOCK
    + """        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
        optimizer.zero_grad()
""",
    "accumulation-every-second-batch": """        loss = criterion(model(x), y) / 2
        if not math.isfinite(loss.item()):
            continue
"""
    + _BLOCK
    + """        if (i + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
""",
}

STEP = re.compile(r"^step (\d+) ", re.M)
FINAL_SCALE = re.compile(r"^final scale (\S+)$", re.M)


def _program(level: str, body: str) -> str:
    return PROGRAM.replace("LEVEL", level).replace("BODY\n", body)


def _run(source: str, folder: pathlib.Path) -> str:
    folder.mkdir()
    (folder / "main.py").write_text(source)
    return run_program(folder)


#: the (shape, level) pairs run by default; the rest are marked slow
FAST = {("nan-guard-continue", "O2"), ("loss-over-several-model-calls", "O1")}
CASES = [
    pytest.param(shape, level, marks=() if (shape, level) in FAST else pytest.mark.slow, id=f"{shape}-{level}")
    for shape in sorted(BODIES)
    for level in ("O1", "O2")
]


@pytest.mark.parametrize("shape, level", CASES)
def test_the_exact_migration_prints_apexs_numbers_and_the_default_runs_the_same_steps(shape, level, tmp_path):
    source = _program(level, BODIES[shape])
    exact = migrate_source(source, "main.py", exact=True)
    assert not exact.diagnostics, [d.code for d in exact.diagnostics]
    assert "with model.scale_loss(loss, amp_scaler) as scaled_loss:\n            scaled_loss.backward()\n" in (
        exact.migrated
    )
    assert "forward_backward" not in exact.migrated and "apex" not in exact.migrated
    original = _run(source, tmp_path / "original")
    assert float(FINAL_SCALE.findall(original)[0]) < 2.0**16  # batch 2 overflowed: a skipped step
    assert _run(exact.migrated, tmp_path / "exact") == original
    default = migrate_source(source, "main.py", exact=False)
    assert not default.diagnostics
    assert STEP.findall(_run(default.migrated, tmp_path / "default")) == STEP.findall(original)
