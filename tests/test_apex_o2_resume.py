"""apex O2 with ``model.load_state_dict(...)`` before training and in the middle of it, run
as written on tests/fake_apex and as ``roundpipe-migrate --exact`` output on
roundpipe.compat: the printed numbers are identical.

apex builds its fp32 master weights once, from the fp16 model weights, at the first
``scale_loss`` (reference §3.6), and never reads the model's weights again: weights loaded
before the first block become the masters; weights loaded later are used by the next
forward only, and that step writes the masters back over the fp16 weights. The batch norm,
kept fp32, has no master: apex steps it directly, so its loaded values take effect either
way (roundpipe.compat.model.AmpRoundPipe._keeps_masters_on_load).
"""

from __future__ import annotations

import pathlib

import pytest

from migrate.engine import migrate_source
from test_migrate_projects import run_program

PROGRAM = """import copy

import torch
from apex import amp


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Tanh(), torch.nn.Linear(16, 2)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    checkpoint = copy.deepcopy(model.state_dict())
    with torch.no_grad():
        for value in checkpoint.values():
            if value.is_floating_point():
                value.add_(0.01)  # a checkpoint that differs from the initial weights
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=generator), torch.randn(16, 2, generator=generator)) for _ in range(6)]
    for i, (x, y) in enumerate(data):
        if i == LOAD_AT:
            model.load_state_dict(checkpoint)
        loss = torch.nn.functional.mse_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        first = next(model.parameters()).float().sum().item()
        norm = list(model.parameters())[2].float().sum().item()  # the batch norm weight
        print(f"step {i} loss {loss.item():.10f} weight {first:.10f} batch norm {norm:.10f}")


if __name__ == "__main__":
    main()
"""


def _run(source: str, folder: pathlib.Path) -> str:
    folder.mkdir()
    (folder / "main.py").write_text(source)
    return run_program(folder)


@pytest.mark.parametrize("load_at", [0, 3], ids=["before-the-first-block", "in-the-middle-of-training"])
def test_o2_weights_loaded_into_the_model_follow_apexs_masters(load_at, tmp_path):
    source = PROGRAM.replace("LOAD_AT", str(load_at))
    migrated = migrate_source(source, "main.py", exact=True)
    assert not migrated.diagnostics and "model.model.load_state_dict(checkpoint)" in migrated.migrated
    original = _run(source, tmp_path / "original")
    assert _run(migrated.migrated, tmp_path / "exact") == original
