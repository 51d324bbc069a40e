"""A trainer class's wrapped model handed, through an instance built by the driving script,
to a function of another given file (``evaluate(trainer.model, x)``,
``save_checkpoint(trainer.model, ...)`` of utils.py): that function is not followed across
files (it would save the wrapper's keys, evaluate without waiting for the step), so the
program is refused as it is for a plain model handed across (RPM110)."""

import pytest

from migrate.project import migrate_project

TRAINER = """import torch
import torch.nn as nn


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    def train_step(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return loss.item()
"""

UTILS = """import torch


@torch.no_grad()
def evaluate(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y).item()


def save_checkpoint(model, optimizer, path):
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
"""

MAIN = """import torch
from trainer import Trainer
from utils import evaluate, save_checkpoint


def main():
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    trainer = Trainer()
    for step in range(3):
        print(step, trainer.train_step(x, y), trainer.optimizer.param_groups[0]["lr"])
    USE


main()
"""

USES = {
    "evaluated": ("print(evaluate(trainer.model, x, y))", "evaluate"),
    "saved": ('save_checkpoint(trainer.model, trainer.optimizer, "ck.pt")', "save_checkpoint"),
}


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
@pytest.mark.parametrize("use, callee", USES.values(), ids=USES.keys())
def test_an_instance_model_handed_to_a_function_of_another_file_refuses_the_program(use, callee, exact):
    main = MAIN.replace("USE", use)
    results = migrate_project({"trainer.py": TRAINER, "utils.py": UTILS, "main.py": main}, exact=exact)
    assert not any(r.changed for r in results.values())
    [diagnostic] = results["main.py"].diagnostics
    assert (diagnostic.code, diagnostic.line) == ("RPM110", main.splitlines().index(f"    {use}") + 1)
    assert f"'trainer.model' would be wrapped with RoundPipe, but it is passed to {callee}() of utils.py" in (
        diagnostic.message
    )


def test_the_instance_model_read_by_the_script_itself_still_migrates():
    main = MAIN.replace("USE", "print(sum(p.sum().item() for p in trainer.model.parameters()))")
    results = migrate_project({"trainer.py": TRAINER, "utils.py": UTILS, "main.py": main}, exact=True)
    assert results["trainer.py"].status == "migrated"
    assert not any(d.code == "RPM110" for r in results.values() for d in r.diagnostics)
