"""An apex O2 script that accumulates gradients over several ``scale_loss`` blocks, run as
written on tests/fake_apex (apex's documented rules) and as ``roundpipe-migrate --exact``
output on roundpipe.compat: the printed numbers are identical (issue 16).

One batch has targets 1000 times larger: its float16 gradients overflow at the dynamic scale
while its loss stays finite, so the run includes a skipped step and a halved scale.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import runpy
import sys

import pytest

from migrate.engine import migrate_source

FAKE_APEX = pathlib.Path(__file__).parent / "fake_apex"

SCRIPT = """
import torch
import torch.nn as nn
from apex import amp


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    criterion = nn.MSELoss()
    accum_steps = ACCUM
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=generator), torch.randn(16, 2, generator=generator))
            for _ in range(4 * accum_steps)]
    data[OVERFLOW] = (data[OVERFLOW][0], data[OVERFLOW][1] * 1000.0)
    optimizer.zero_grad()
    for i, (inputs, targets) in enumerate(data):
        output = model(inputs)
        loss = criterion(output, targets) / accum_steps
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
        weight = next(model.parameters()).float().sum().item()
        print(f"step {i} loss {loss.item():.10f} weight {weight:.10f}")


if __name__ == "__main__":
    main()
"""


def _printed(source: str, path: pathlib.Path) -> str:
    path.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    return out.getvalue()


@pytest.mark.parametrize(
    "accumulate, overflow",
    [(2, 2), (3, 7)],
    ids=["acc2-overflow-in-the-first-block", "acc3-overflow-in-the-second-block"],
)
def test_exact_migration_of_an_o2_accumulation_script_prints_apexs_numbers(accumulate, overflow, tmp_path, monkeypatch):
    source = SCRIPT.replace("ACCUM", str(accumulate)).replace("OVERFLOW", str(overflow))
    monkeypatch.syspath_prepend(str(FAKE_APEX))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    monkeypatch.delitem(sys.modules, "apex.amp", raising=False)
    original = _printed(source, tmp_path / "original.py")
    from apex import amp

    apex_scale = amp._amp_state.loss_scalers[0].loss_scale()
    assert apex_scale == 2.0**15  # the overflow halved it once
    migrated = migrate_source(source, "script.py", exact=True).migrated
    assert "roundpipe.compat" in migrated and "apex" not in migrated
    ours = _printed(migrated, tmp_path / "migrated.py")
    assert ours == original
    import roundpipe.compat

    assert roundpipe.compat.loss_scaler().get_scale() == apex_scale


LOSS_ID_SCRIPT = """
import torch
from apex import amp


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", num_losses=2, verbosity=0)
    generator = torch.Generator().manual_seed(2)
    inputs = [torch.randn(8, 4, generator=generator) for _ in range(6)]
    inputs[2] = inputs[2] * 3e3  # its fp16 gradients overflow; the loss stays finite
    for step, x in enumerate(inputs):
        loss = model(x).pow(2).mean()
        with amp.scale_loss(loss, optimizer, loss_id=1) as scaled:
            scaled.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.10f}")


if __name__ == "__main__":
    main()
"""


def test_loss_id_k_migrates_to_loss_ks_scaler_without_a_shared_scaler_note(tmp_path, monkeypatch):
    result = migrate_source(LOSS_ID_SCRIPT, "script.py", exact=True)
    assert "roundpipe.compat.loss_scaler(1).scale(loss)" in result.migrated
    assert not [d for d in result.diagnostics if d.code == "RPM302"]
    monkeypatch.syspath_prepend(str(FAKE_APEX))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    monkeypatch.delitem(sys.modules, "apex.amp", raising=False)
    original = _printed(LOSS_ID_SCRIPT, tmp_path / "original.py")
    from apex import amp

    scales = [s.loss_scale() for s in amp._amp_state.loss_scalers]
    assert scales[0] == 2.0**16 and scales[1] < 2.0**16  # only loss 1 overflowed
    assert _printed(result.migrated, tmp_path / "migrated.py") == original
    import roundpipe.compat

    assert [roundpipe.compat.loss_scaler(k).get_scale() for k in (0, 1)] == scales
