"""Grad norms measured in the step and read after it (issue 10, shape 9): the migrated
program prints the original's norms, at module level (``global``) and in a function
(``nonlocal``), in both the ``--exact`` and the default migration."""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
gen = torch.Generator().manual_seed(5)
for step in range(6):
    x, y = torch.randn(10, 6, generator=gen) * 4, torch.randint(0, 3, (10,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item()!r} grad_norm {grad_norm.item()!r}")
print(f"final scale {scaler.get_scale()!r}")
"""

IN_A_FUNCTION = (
    "def main():\n"
    + "".join(f"    {line}\n" if line else "\n" for line in SCRIPT.strip().splitlines())
    + "\n\nmain()\n"
)


@pytest.mark.parametrize("source", [SCRIPT, IN_A_FUNCTION], ids=["module", "function"])
def test_a_norm_read_after_the_step_prints_the_originals_values(source, tmp_path):
    original = run_script(source, tmp_path, "original.py")
    assert original.count("grad_norm ") == 6
    for exact in (True, False):
        result = migrate_source(source, "train.py", exact=exact)
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert ("global grad_norm" in result.migrated) == (source is SCRIPT)
        assert "model.step(_step_fn, is_async=False)" in result.migrated
        assert run_script(result.migrated, tmp_path, f"migrated_{exact}.py") == original
