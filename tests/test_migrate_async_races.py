"""Main-thread statements that must wait for a running asynchronous step (issue 9: no races
with the optimizer thread) when the step is reached in the shapes of issue 10: an lr written
through an alias of the optimizer, a checkpoint after a step run by a helper function, an lr
written by the caller of a trainer handed the optimizer. Each gets ``model.synchronize()``
on the line before it in the default (asynchronous) migration."""

from migrate.engine import migrate_source

ALIAS = """import torch
from torch.cuda.amp import GradScaler, autocast

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = GradScaler()
opt = optimizer
for i in range(3):
    for g in opt.param_groups:
        g["lr"] = 0.1 / (i + 1)
    with autocast():
        loss = model(torch.randn(2, 4)).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""

HELPERS = """import torch
from torch.cuda.amp import GradScaler, autocast


def backward_step(loss, grad_scaler):
    grad_scaler.scale(loss).backward()


def optimizer_step(optimizer, grad_scaler, model):
    grad_scaler.step(optimizer)
    grad_scaler.update()
    optimizer.zero_grad()


def main(path):
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler()
    for i in range(3):
        with autocast():
            loss = model(torch.randn(2, 4)).sum()
        backward_step(loss, scaler)
        optimizer_step(optimizer, scaler, model)
        torch.save(model.state_dict(), path)
"""

HANDED = """import torch
from torch.cuda.amp import GradScaler, autocast


class Trainer:
    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.scaler = GradScaler()

    def train_step(self, x):
        with autocast():
            loss = self.model(x).sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    t = Trainer(model, optimizer)
    for i in range(3):
        t.train_step(torch.randn(2, 4))
        for g in optimizer.param_groups:
            g["lr"] *= 0.5
"""


def _line_before(migrated: str, line: str) -> str:
    lines = migrated.splitlines()
    return lines[lines.index(line) - 1].strip()


def _migrated(source: str) -> str:
    result = migrate_source(source, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    compile(result.migrated, "train.py", "exec")
    return result.migrated


def test_an_lr_written_through_an_alias_of_the_optimizer_waits_for_the_step():
    migrated = _migrated(ALIAS)
    assert _line_before(migrated, "    for g in opt.param_groups:") == "model.synchronize()"


def test_a_checkpoint_after_a_step_run_by_a_helper_function_waits_for_it():
    migrated = _migrated(HELPERS)
    assert "    model.step(_step_fn)" in migrated  # the helper's step, asynchronous
    assert _line_before(migrated, "        torch.save(model.model.state_dict(), path)") == "model.synchronize()"


def test_an_lr_written_by_the_caller_of_a_trainer_method_waits_for_the_step():
    migrated = _migrated(HANDED)
    assert "        self.model.step(_step_fn)" in migrated
    assert _line_before(migrated, "        for g in optimizer.param_groups:") == "model.synchronize()"
