"""Main-thread statements that must wait for a running asynchronous step (issue 9: no races
with the optimizer thread) when the step is reached in the shapes of issue 10: an lr written
through an alias of the optimizer, a checkpoint after a step run by a helper function, an lr
written by the caller of a trainer handed the optimizer. Each gets ``model.synchronize()``
on the line before it in the default (asynchronous) migration."""

import contextlib
import io
import pathlib
import runpy
import time

import pytest
import torch

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


def _printed(source: str, tmp_path: pathlib.Path, name: str) -> str:
    script = tmp_path / name
    script.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(script), run_name="__main__")
    return out.getvalue()


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


# A read after the step of what the step writes in place (issue 9 review: reads that are
# not method calls of the scheduler were left racing).
READ_AFTER_STEP = """import torch


def main(path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    opt = optimizer
    for step in range(4):
        optimizer.zero_grad()
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = model(torch.ones(2, 4)).float().sum()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        READ
        print(f"step {step} read {seen}")


if __name__ == "__main__":
    main("checkpoint.pt")
"""

READS = {
    "scheduler_attribute": "seen = scheduler.last_epoch",
    "optimizer_state_dict": 'seen = len(optimizer.state_dict()["state"])',
    "optimizer_only_checkpoint": "seen = torch.save(optimizer.state_dict(), path)",
    "optimizer_state": "seen = [optimizer.state[p] for p in model.parameters()]",
    "logged_lr": 'seen = optimizer.param_groups[0]["lr"]',
    "alias_state_dict": 'seen = len(opt.state_dict()["state"])',
}


@pytest.mark.parametrize("read", list(READS.values()), ids=list(READS))
def test_a_read_of_what_the_step_writes_waits_for_the_step(read):
    source = READ_AFTER_STEP.replace("READ", read)
    migrated = _migrated(source)
    assert "        model.step(_step_fn)" in migrated
    assert _line_before(migrated, f"        {read}") == "model.synchronize()"
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated" and "synchronize" not in exact.migrated  # synchronous already


def test_a_scheduler_attribute_read_after_a_slowed_step_sees_the_originals_value(tmp_path, monkeypatch):
    """The optimizer thread's step (and the scheduler step in the step function) is slowed:
    the main thread's read of ``scheduler.last_epoch`` must still print the original's."""
    plain_step = torch.optim.SGD.step

    def slow_step(self, closure=None):
        time.sleep(0.05)
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slow_step)
    monkeypatch.chdir(tmp_path)
    source = READ_AFTER_STEP.replace("READ", READS["scheduler_attribute"])
    original, migrated = _printed(source, tmp_path, "original.py"), _printed(_migrated(source), tmp_path, "async.py")
    assert migrated == original and original.count("step ") == 4


# The scheduler of a trainer method handed the optimizer, held in an attribute whose name
# does not say "sched" (issue 9 review m1).
ATTRIBUTE_SCHEDULER = """import torch


class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = torch.amp.GradScaler("cpu")

    def train_step(self, x, optimizer):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.model(x).float().sum()
        optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
        return loss.item()

    def fit(self, batches, optimizer):
        self.warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 0.5**n)
        for x in batches:
            loss = self.train_step(x, optimizer)
            self.warmup.step()
            print(loss)


def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model)
    trainer.fit([torch.ones(2, 4)] * 3, optimizer)
"""


def test_a_scheduler_in_an_attribute_stepped_after_a_handed_step_is_refused():
    result = migrate_source(ATTRIBUTE_SCHEDULER, "train.py")
    assert result.status == "partial"
    assert any(d.code == "RPM108" and "self.warmup.step()" in d.format() for d in result.diagnostics)
    assert migrate_source(ATTRIBUTE_SCHEDULER, "train.py", exact=True).status == "migrated"


# An object built with the optimizer and held in an attribute (``self.policy``), driven
# after a trainer method handed the optimizer.
ATTRIBUTE_POLICY = """import torch


class Policy:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step_update(self, n):
        for group in self.optimizer.param_groups:
            group["lr"] = 0.1 / (1 + n)


class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = torch.amp.GradScaler("cpu")

    def train_step(self, x, optimizer):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.model(x).float().sum()
        optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
        return loss.item()

    def fit(self, batches, optimizer):
        self.policy = Policy(optimizer)
        for n, x in enumerate(batches):
            loss = self.train_step(x, optimizer)
            self.policy.step_update(n)
            print(loss)


def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model)
    trainer.fit([torch.ones(2, 4)] * 3, optimizer)
"""


def test_an_attribute_built_with_the_optimizer_driven_after_a_handed_step_is_refused():
    result = migrate_source(ATTRIBUTE_POLICY, "train.py")
    assert result.status == "partial"
    assert any(d.code == "RPM108" and "self.policy.step_update(n)" in d.format() for d in result.diagnostics)
    assert migrate_source(ATTRIBUTE_POLICY, "train.py", exact=True).status == "migrated"
