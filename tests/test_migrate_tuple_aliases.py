"""A trainer method reading its objects into locals by one tuple assignment
(``model, optimizer, scaler = self.model, self.optimizer, self.scaler``; migrate/torch_amp.py
follows the scaler through it, migrate/attribute_aliases.py the optimizer and the model).

With the scaler in the tuple the file was refused (RPM105 at ``self.scaler``, and RPM104
claiming the method "is not called in this file" although ``trainer.train_step(...)`` calls
it); it now migrates and prints the original's numbers under ``--exact`` (the default form
runs as many steps), on the AMP path and the plain one. A scaler the method binds from
something the migration does not follow is still refused, naming that binding.
"""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, amp):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.scaler = torch.amp.GradScaler("cpu", enabled=amp, init_scale=512.0, growth_interval=2)

    def train_step(self, x, y):
        #ALIASES#
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x)
        loss = F.mse_loss(pred.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        return loss


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    trainer = Trainer(model, "--no-amp" not in sys.argv)
    gen = torch.Generator().manual_seed(3)
    for step in range(5):
        x = torch.randn(20, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True) * 0.3
        loss = trainer.train_step(x, y)
        print(f"step {step} loss {loss.item()!r} lr {trainer.scheduler.get_last_lr()[0]!r}")
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
"""


def _program(aliases: str) -> str:
    return PROGRAM.replace("        #ALIASES#\n", aliases)


@pytest.mark.parametrize(
    "aliases",
    [
        "        model, optimizer, scaler, scheduler = self.model, self.optimizer, self.scaler, self.scheduler\n",
        "        model = self.model\n        optimizer, scaler = self.optimizer, self.scaler\n"
        "        scheduler = self.scheduler\n",
    ],
    ids=["one-tuple", "pair"],
)
def test_a_scaler_unpacked_from_the_instance_migrates_with_the_same_numbers(aliases, tmp_path):
    source = _program(aliases)
    exact = migrate_source(source, "train.py", exact=True)
    default = migrate_source(source, "train.py")
    for result in (exact, default):
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert "self.model.step(_step_fn" in result.migrated
        again = migrate_source(result.migrated, "train.py", exact=result is exact)
        assert again.migrated == result.migrated and not again.diagnostics
    for argv in ([], ["--no-amp"]):
        original = run_script(source, tmp_path, "original.py", argv)
        assert original.count("step ") == 5
        assert run_script(exact.migrated, tmp_path, "exact.py", argv) == original
        assert run_script(default.migrated, tmp_path, "default.py", argv).count("step ") == 5


def test_an_unfollowed_scaler_of_a_called_method_names_its_binding():
    """``trainer.train_step(x, y, trainer.scaler)`` calls the method: the diagnostic says
    what stops the migration (a parameter), not that nothing calls it."""
    source = (
        _program("        model, optimizer, scheduler = self.model, self.optimizer, self.scheduler\n")
        .replace("def train_step(self, x, y):", "def train_step(self, x, y, scaler):")
        .replace("trainer.train_step(x, y)", "trainer.train_step(x, y, trainer.scaler)")
    )
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    backward = [d.message for d in result.diagnostics if d.code == "RPM104"]
    assert len(backward) == 1, [d.format() for d in result.diagnostics]
    assert "is not called in this file" not in backward[0]
    assert "it is a parameter of train_step()" in backward[0]
