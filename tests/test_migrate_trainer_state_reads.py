"""A trainer instance's step state read in the class's own file after a training call
(review F2): ``trainer.scheduler.get_last_lr()`` after ``trainer.train_step(x, y)`` would
race with the asynchronous step that steps the scheduler; it waits for that step through the
instance's model (``trainer.model.synchronize()``). Run with a slowed optimizer step,
original against the default migration."""

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """import torch
from torch import nn

torch.manual_seed(0)


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.LinearLR(self.optimizer, start_factor=0.1, total_iters=4)
        self.scaler = torch.amp.GradScaler("cpu")
        self.global_step = 0

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.smooth_l1_loss(self.model(x).float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.global_step += 1
        return loss.detach()


def main():
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 2))
    trainer = Trainer(model, lr=0.1)
    data = [(torch.randn(5, 6), torch.randn(5, 2)) for _ in range(4)]
    for x, y in data:
        trainer.train_step(x, y)
        print("step", trainer.global_step, "lr", repr(trainer.scheduler.get_last_lr()[0]))
    print("epoch", trainer.scheduler.last_epoch)


if __name__ == "__main__":
    main()
"""


def _lines_before(source: str, fragment: str) -> list:
    lines = source.splitlines()
    return [lines[i - 1].strip() for i, line in enumerate(lines) if fragment in line]


def test_a_trainers_scheduler_read_after_its_step_waits_for_it(slow_step, tmp_path):
    result = migrate_source(PROGRAM, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    migrated = result.migrated
    assert _lines_before(migrated, "trainer.scheduler.") == ["trainer.model.synchronize()"] * 2
    original = run_script(PROGRAM, tmp_path, "original.py")
    asynchronous = run_script(migrated, tmp_path, "async.py")
    assert asynchronous == original
    assert migrate_source(migrated, "train.py").migrated == migrated  # idempotent


def test_the_exact_form_adds_no_wait():
    migrated = migrate_source(PROGRAM, "train.py", exact=True).migrated
    assert "synchronize()" not in migrated
