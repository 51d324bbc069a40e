"""A ``synchronize()`` the default form needs between a forward and its backward (before a
main-thread ``optimizer.zero_grad()`` placed after the forward, in the autograd form) would
copy the newest weights over the ones the backward still needs (autograd raises "modified by
an inplace operation"): it goes before the forward instead, which waits for the same step
(migrate/model_uses.py, ``_before_forward``). Run with a slowed optimizer step."""

import time

import pytest
import torch

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """import torch


def train(model, optimizer, scaler, batches):
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):
            out = model(x)
            loss = torch.nn.functional.mse_loss(out.float(), y)
        optimizer.zero_grad()
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        print("step", repr(loss.item()))


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    gen = torch.Generator().manual_seed(1)
    train(model, optimizer, scaler, [(torch.randn(8, 4, generator=gen), torch.randn(8, 2, generator=gen))] * 4)


main()
"""


@pytest.fixture
def slow_step(monkeypatch):
    plain_step = torch.optim.SGD.step

    def slowed(self, closure=None):
        time.sleep(0.03)
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slowed)


def test_the_synchronize_goes_before_the_forward_and_the_backward_runs(slow_step, tmp_path):
    result = migrate_source(PROGRAM, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    lines = result.migrated.splitlines()
    forward = lines.index('        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=scaler is not None):')
    assert lines[forward - 1] == "        model.synchronize()"
    assert "synchronize" not in "\n".join(lines[forward : lines.index("        optimizer.zero_grad()")])
    original = run_script(PROGRAM, tmp_path, "original.py").splitlines()
    asynchronous = run_script(result.migrated, tmp_path, "async.py").splitlines()
    assert len(asynchronous) == len(original) == 4
