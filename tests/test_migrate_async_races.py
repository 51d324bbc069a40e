"""Main-thread statements that must wait for a running asynchronous step (issue 9: no races
with the optimizer thread) when the step is reached in the shapes of issue 10: an lr written
through an alias of the optimizer, a checkpoint after a step run by a helper function, an lr
written by the caller of a trainer handed the optimizer, and writes (scheduler steps, lr
loops, ``add_param_group``, through an alias or an object built with the optimizer) by the
callers of a module function that runs the step, one or two calls up. Each gets
``model.synchronize()`` on the line before it in the default (asynchronous) migration; a
caller with no name for the model is refused."""

import time

import pytest
import torch

from migrate.engine import migrate_source
from script_runs import run_script

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


# A module function runs the step; its callers (one or two levels up) write the optimizer.
STEP_FUNCTION = """import torch
from torch.cuda.amp import GradScaler, autocast


def train_step(model, x, optimizer, scaler):
    with autocast():
        loss = model(x).sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.item()
"""

MAIN = """

def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)
    scaler = GradScaler()
    fit(model, optimizer, scheduler, scaler)
"""

CALLER_WRITES = {
    "scheduler": ("        scheduler.step()\n", "        scheduler.step()"),
    "lr_loop": (
        '        for g in optimizer.param_groups:\n            g["lr"] *= 0.5\n',
        "        for g in optimizer.param_groups:",
    ),
    "add_param_group": (
        "        optimizer.add_param_group({'params': [torch.nn.Parameter(torch.zeros(1))]})\n",
        "        optimizer.add_param_group({'params': [torch.nn.Parameter(torch.zeros(1))]})",
    ),
    "alias": (
        '        for g in opt.param_groups:\n            g["lr"] *= 0.5\n',
        "        for g in opt.param_groups:",
    ),
    "built_with": ("        policy.update(i)\n", "        policy.update(i)"),
}

POLICY = """

class Policy:
    def __init__(self, optimizer):
        self.optimizer = optimizer

    def update(self, i):
        for g in self.optimizer.param_groups:
            g["lr"] = 0.1 / (i + 1)
"""


def _caller(write: str) -> str:
    return (
        "\n\ndef fit(model, optimizer, scheduler, scaler):\n"
        "    opt = optimizer\n"
        "    policy = Policy(optimizer)\n"
        "    for i in range(3):\n"
        "        train_step(model, torch.randn(2, 4), optimizer, scaler)\n" + write
    )


@pytest.mark.parametrize("variant", sorted(CALLER_WRITES))
def test_a_write_by_the_caller_of_a_step_function_waits_for_the_step(variant):
    write, line = CALLER_WRITES[variant]
    migrated = _migrated(STEP_FUNCTION + POLICY + _caller(write) + MAIN)
    assert "    model.step(_step_fn)" in migrated
    assert _line_before(migrated, line) == "model.synchronize()"


def test_a_write_two_callers_up_from_the_step_function_waits_for_the_step():
    run_epoch = (
        "\n\ndef run_epoch(net, opt, scaler):\n"
        "    for i in range(2):\n"
        "        train_step(net, torch.randn(2, 4), opt, scaler)\n"
        "\n\ndef fit(model, optimizer, scheduler, scaler):\n"
        "    for epoch in range(3):\n"
        "        run_epoch(model, optimizer, scaler)\n"
        "        scheduler.step()\n"
    )
    migrated = _migrated(STEP_FUNCTION + run_epoch + MAIN)
    assert _line_before(migrated, "        scheduler.step()") == "model.synchronize()"
    assert "model.synchronize()\n        run_epoch" not in migrated  # the call itself needs no wait


def test_a_caller_write_without_a_handle_on_the_model_is_refused():
    fit = (
        "\n\ndef fit(models, optimizer, scheduler, scaler):\n"
        "    for i in range(3):\n"
        "        train_step(models[0], torch.randn(2, 4), optimizer, scaler)\n"
        "        scheduler.step()\n"
    )
    result = migrate_source(STEP_FUNCTION + fit + MAIN.replace("fit(model,", "fit([model],"), "train.py")
    assert result.status != "migrated"
    messages = [d.format() for d in result.diagnostics]
    assert any("scheduler.step()" in message and "train_step(" in message for message in messages), messages


def test_caller_writes_get_no_synchronize_in_the_exact_form():
    write, _ = CALLER_WRITES["scheduler"]
    result = migrate_source(STEP_FUNCTION + POLICY + _caller(write) + MAIN, "train.py", exact=True)
    assert result.status == "migrated"
    assert "synchronize()" not in result.migrated


SCHEDULED_FIT = """import torch
import torch.nn as nn


def train_step(model, batch, optimizer, scaler):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = nn.functional.mse_loss(model(x).float(), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return loss.item()


def run_epoch(model, batches, optimizer, scaler):
    return [train_step(model, batch, optimizer, scaler) for batch in batches]


def fit(model, batches, optimizer, scheduler, scaler):
    for epoch in range(3):
        losses = run_epoch(model, batches, optimizer, scaler)
        scheduler.step()
        print(f"epoch {epoch} loss {losses[-1]!r}")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(2)]
    model = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu")
    fit(model, batches, optimizer, scheduler, scaler)


main()
"""


@pytest.mark.slow
def test_a_scheduler_stepped_two_callers_up_does_not_race_with_a_slow_step(tmp_path, monkeypatch):
    """A slow optimizer step records the lr it used: the default (asynchronous) migration
    must step with the original's lr every time, as --exact does (which also prints the
    original's numbers) (without the wait, `scheduler.step()` in
    `fit` lands in the running step of the epoch's last batch)."""
    import contextlib
    import io
    import runpy
    import time

    import torch

    used = []
    plain_step = torch.optim.SGD.step

    def slow_step(self, closure=None):
        time.sleep(0.05)
        used.append(self.param_groups[0]["lr"])
        return plain_step(self, closure)

    monkeypatch.setattr(torch.optim.SGD, "step", slow_step)
    exact = migrate_source(SCHEDULED_FIT, "train.py", exact=True).migrated
    runs, printed = {}, {}
    for name, source in (("original", SCHEDULED_FIT), ("default", _migrated(SCHEDULED_FIT)), ("exact", exact)):
        script, used[:], out = tmp_path / f"{name}.py", [], io.StringIO()
        script.write_text(source)
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
        runs[name], printed[name] = list(used), out.getvalue()
    assert runs["default"] == runs["original"] == runs["exact"] and len(runs["original"]) == 6
    assert printed["exact"] == printed["original"] and printed["original"].count("epoch") == 3
    assert printed["default"].count("epoch") == 3  # the same number of steps, weights one step old


# A trainer method handed the optimizer as a parameter, by the script or by the class's loop.
METHOD_HANDED = """import torch
from torch.cuda.amp import GradScaler, autocast


class Trainer:
    def __init__(self, model):
        self.model = model
        self.scaler = GradScaler()

    def train_step(self, x, optimizer):
        with autocast():
            loss = self.model(x).sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
        optimizer.zero_grad()


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    trainer = Trainer(model)
    for i in range(3):
        trainer.train_step(torch.randn(2, 4), optimizer)
        scheduler.step()
"""

CLASS_LOOP = """import torch
from torch.cuda.amp import GradScaler, autocast


class Trainer:
    def __init__(self, model, optimizer, scheduler):
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = GradScaler()

    def train_step(self, x, optimizer):
        with autocast():
            loss = self.model(x).sum()
        self.scaler.scale(loss).backward()
        self.scaler.step(optimizer)
        self.scaler.update()
        optimizer.zero_grad()

    def fit(self):
        for i in range(3):
            self.train_step(torch.randn(2, 4), self.optimizer)
            self.scheduler.step()


def main():
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    Trainer(model, optimizer, scheduler).fit()
"""


def test_a_scheduler_stepped_after_a_method_handed_the_optimizer_waits_for_the_step():
    migrated = _migrated(METHOD_HANDED)
    assert _line_before(migrated, "        scheduler.step()") == "model.synchronize()"
    assert _line_before(migrated, "        trainer.train_step(torch.randn(2, 4), optimizer)") != "model.synchronize()"


def test_a_scheduler_stepped_by_the_class_loop_after_its_step_method_waits_for_the_step():
    migrated = _migrated(CLASS_LOOP)
    assert _line_before(migrated, "            self.scheduler.step()") == "self.model.synchronize()"


def test_a_scheduler_stepped_by_a_caller_in_another_file_waits_for_the_step():
    from migrate.project import migrate_project

    fit = (
        "import torch\nfrom torch.cuda.amp import GradScaler, autocast\n\nfrom steps import train_step\n"
        "\n\ndef fit(model, optimizer, scheduler, scaler):\n"
        "    for i in range(3):\n"
        "        train_step(model, torch.randn(2, 4), optimizer, scaler)\n"
        "        scheduler.step()\n" + MAIN
    )
    results = migrate_project({"steps.py": STEP_FUNCTION, "main.py": fit})
    assert [r.status for r in results.values()] == ["migrated", "migrated"], [
        d.format() for r in results.values() for d in r.diagnostics
    ]
    assert "    model.step(_step_fn)" in results["steps.py"].migrated
    assert _line_before(results["main.py"].migrated, "        scheduler.step()") == "model.synchronize()"


GLOBAL_MODEL = """import torch
from torch.cuda.amp import GradScaler, autocast

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
scaler = GradScaler()


def train_step(x, opt):
    with autocast():
        loss = model(x).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def fit(opt):
    for i in range(3):
        train_step(torch.randn(2, 4), opt)
        for g in opt.param_groups:
            g["lr"] *= 0.5


fit(optimizer)
scheduler.step()
"""


def test_writes_after_a_step_function_on_a_module_level_model_wait_for_the_step():
    migrated = _migrated(GLOBAL_MODEL)
    assert _line_before(migrated, "        for g in opt.param_groups:") == "model.synchronize()"
    assert _line_before(migrated, "scheduler.step()") == "model.synchronize()"


def test_a_write_where_the_model_is_built_waits_above_a_caller_without_a_handle_on_it():
    """`fit` has no name for the model, but `main`, which built it, waits on its own name."""
    fit = (
        "\n\ndef fit(models, optimizer, scaler):\n"
        "    for i in range(3):\n"
        "        train_step(models[0], torch.randn(2, 4), optimizer, scaler)\n"
        "\n\ndef main():\n"
        "    model = torch.nn.Linear(4, 4)\n"
        "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.5)\n"
        "    scaler = GradScaler()\n"
        "    fit([model], optimizer, scaler)\n"
        "    scheduler.step()\n"
    )
    migrated = _migrated(STEP_FUNCTION + fit)
    assert _line_before(migrated, "    scheduler.step()") == "model.synchronize()"


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
    original, migrated = (
        run_script(source, tmp_path, "original.py"),
        run_script(_migrated(source), tmp_path, "async.py"),
    )
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


def test_a_scheduler_in_an_attribute_stepped_after_a_handed_step_waits_for_the_step():
    """The scheduler is found by what builds it, not by its name; the caller's write of a
    trainer method handed the optimizer waits for the step (issue 9 review m1)."""
    migrated = _migrated(ATTRIBUTE_SCHEDULER)
    assert "self.model.step(_step_fn)" in migrated
    assert _line_before(migrated, "            self.warmup.step()") == "self.model.synchronize()"
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


def test_an_attribute_built_with_the_optimizer_driven_after_a_handed_step_waits_for_the_step():
    migrated = _migrated(ATTRIBUTE_POLICY)
    assert "self.model.step(_step_fn)" in migrated
    assert _line_before(migrated, "            self.policy.step_update(n)") == "self.model.synchronize()"
    assert migrate_source(ATTRIBUTE_POLICY, "train.py", exact=True).status == "migrated"
