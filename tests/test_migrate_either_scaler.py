"""A GradScaler chosen by a conditional expression (migrate/either_scaler.py), and the
diagnostic of one that is not followed (migrate/scaler_bindings.py).

``scaler = GradScaler("cuda") if use_cuda else GradScaler("cpu")`` (a local or a trainer's
attribute, nested too) was refused with RPM104 and a hint about "a function nobody here
calls"; every branch now becomes ``roundpipe.GradScaler`` and the program prints the
original's numbers under ``--exact`` (the default form runs as many steps). A conditional
with a branch that is no GradScaler stays refused, and the diagnostic names that binding.
"""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class NoScaler:
    def scale(self, loss):
        return loss

    def step(self, optimizer):
        optimizer.step()

    def update(self):
        pass

    def get_scale(self):
        return 1.0


class Trainer:
    def __init__(self, model, use_cuda, amp):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        #SCALER#

    def train_step(self, x, y):
        self.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = self.model(x)
        loss = F.mse_loss(pred.float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss


def main():
    amp = "--no-amp" not in sys.argv
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    trainer = Trainer(model, torch.cuda.is_available() and "--cuda" in sys.argv, amp)
    gen = torch.Generator().manual_seed(3)
    for step in range(5):
        x = torch.randn(20, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True) * 0.3
        loss = trainer.train_step(x, y)
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
"""

_CPU = 'torch.amp.GradScaler("cpu", enabled=amp, init_scale=512.0, growth_interval=2)'
_CUDA = 'torch.amp.GradScaler("cuda", init_scale=256.0)'


def _program(scaler: str) -> str:
    return PROGRAM.replace("        #SCALER#\n", scaler)


@pytest.mark.parametrize(
    "scaler",
    [
        f"        self.scaler = {_CUDA} if use_cuda else {_CPU}\n",
        f"        self.scaler = {_CUDA} if use_cuda else {_CPU} if amp "
        "else torch.amp.GradScaler('cpu', enabled=False)\n",
    ],
    ids=["two-branches", "nested"],
)
def test_a_scaler_built_in_every_branch_migrates_with_the_same_numbers(scaler, tmp_path):
    source = _program(scaler)
    exact = migrate_source(source, "train.py", exact=True)
    default = migrate_source(source, "train.py")
    for result in (exact, default):
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert "torch.amp.GradScaler" not in result.migrated
        assert result.migrated.count("roundpipe.GradScaler(") == scaler.count("GradScaler(")
        again = migrate_source(result.migrated, "train.py", exact=result is exact)
        assert again.migrated == result.migrated and not again.diagnostics
    for argv in ([], ["--no-amp"]):
        original = run_script(source, tmp_path, "original.py", argv)
        assert original.count("step ") == 5
        assert run_script(exact.migrated, tmp_path, "exact.py", argv) == original
        assert run_script(default.migrated, tmp_path, "default.py", argv).count("step ") == 5


def test_a_scaler_that_only_some_branches_build_is_refused_naming_its_binding():
    """The trainer's attribute (RPM120), and a local name of a function called here (RPM104)."""
    attribute = migrate_source(_program(f"        self.scaler = {_CPU} if amp else NoScaler()\n"), "train.py")
    local = PROGRAM.split("class Trainer")[0] + (
        "def train(model, batches, amp):\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n"
        f"    scaler = {_CPU} if amp else NoScaler()\n"
        "    for x, y in batches:\n"
        "        loss = F.mse_loss(model(x), y)\n"
        "        scaler.scale(loss).backward()\n"
        "        scaler.step(optimizer)\n"
        "        scaler.update()\n\n\n"
        "train(nn.Linear(2, 1), [(torch.ones(1, 2), torch.ones(1, 1))], True)\n"
    )
    for result, code in ((attribute, "RPM120"), (migrate_source(local, "train.py"), "RPM104")):
        assert result.migrated == result.original
        assert [d.code for d in result.diagnostics] == [code], [d.format() for d in result.diagnostics]
        message = result.diagnostics[0].message
        assert "nobody here calls" not in message and "handed in by the caller" not in message
        assert "NoScaler()" in message and "GradScaler in every branch" in message
