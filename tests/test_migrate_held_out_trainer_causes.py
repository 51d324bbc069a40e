"""Refusals of held-out trainer shapes name their real cause (tests/migrate_projects/
espnet_classmethod, yolox_trainer_hooks).

An ESPnet-style trainer hands the scaler from one class method to another through
``cls.train_one_epoch(...)``: the diagnostic says the scaler is not followed into class
methods, not that the function is defined or called elsewhere. A YOLOX-style trainer gets
its optimizer from another object's method: the diagnostic names that call, not parameter
groups of submodules. A script building a refused trainer class of another file names the
refusal in that file.
"""

from migrate.engine import migrate_source
from migrate.project import migrate_project

CLASS_METHODS = """import torch


class Trainer:
    @classmethod
    def run(cls, model, optimizer, batches):
        scaler = torch.amp.GradScaler("cpu")
        for x in batches:
            cls.train_one_step(model=model, optimizer=optimizer, scaler=scaler, x=x)

    @classmethod
    def train_one_step(cls, model, optimizer, scaler, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
"""

FOREIGN_OPTIMIZER = """import torch


class Trainer:
    def __init__(self, exp):
        self.exp = exp
        self.scaler = torch.amp.GradScaler("cpu")
        self.model = torch.nn.Linear(3, 1)
        self.optimizer = self.exp.get_optimizer(8)

    def train_one_iter(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.model(x).float().pow(2).mean()
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
"""

SCRIPT = """from trainer import Trainer


def main(exp, batches):
    trainer = Trainer(exp)
    for x in batches:
        trainer.train_one_iter(x)
"""


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_scaler_handed_to_a_class_method_is_refused_as_such():
    result = migrate_source(CLASS_METHODS, "trainer.py")
    assert not result.changed
    found = {(d.code, d.line): d.message for d in result.diagnostics}
    handed = found[("RPM104", _line(CLASS_METHODS, "cls.train_one_step("))]
    assert "train_one_step(), a class method of Trainer" in handed
    backward = found[("RPM104", _line(CLASS_METHODS, "scaler.scale(loss)"))]
    assert "called as `cls.train_one_step(...)`" in backward
    for message in found.values():
        assert "defined elsewhere" not in message and "not called in this file" not in message


def test_the_near_miss_with_a_plain_function_keeps_its_words():
    plain = CLASS_METHODS.replace("cls.train_one_step(", "helpers.train_one_step(")
    messages = [d.message for d in migrate_source(plain, "trainer.py").diagnostics]
    assert any("defined elsewhere" in message for message in messages)
    assert not any("class method" in message for message in messages)


def test_an_optimizer_from_another_objects_method_is_named_by_its_call():
    (diagnostic,) = migrate_source(FOREIGN_OPTIMIZER, "trainer.py").diagnostics
    assert (diagnostic.code, diagnostic.line) == ("RPM108", _line(FOREIGN_OPTIMIZER, "get_optimizer"))
    assert "`self.exp.get_optimizer(...)`" in diagnostic.message
    assert "submodules" not in diagnostic.message


def test_grouped_submodule_parameters_keep_their_words():
    grouped = FOREIGN_OPTIMIZER.replace(
        "self.exp.get_optimizer(8)", "torch.optim.SGD(self.exp.model.parameters(), lr=0.1)"
    )
    messages = [d.message for d in migrate_source(grouped, "trainer.py").diagnostics]
    assert messages and not any("get_optimizer" in message for message in messages)


def test_a_script_using_a_refused_trainer_names_the_refusal():
    results = migrate_project({"trainer.py": FOREIGN_OPTIMIZER, "main.py": SCRIPT})
    assert not any(result.changed for result in results.values())
    (diagnostic,) = results["main.py"].diagnostics
    assert diagnostic.code == "RPM111"
    where = f"trainer.py:{_line(FOREIGN_OPTIMIZER, 'get_optimizer')} (RPM108)"
    assert f"refused at {where}" in diagnostic.message
    assert "wrapper class" not in diagnostic.message


HOOKED_LOOP = """import torch


class HookBase:
    trainer = None

    def after_step(self):
        pass


class AMPTrainer:
    def __init__(self, model, optimizer, hooks, grad_scaler=None):
        self.model = model
        self.optimizer = optimizer
        self.hooks = hooks
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler("cpu")
        self.grad_scaler = grad_scaler

    def run_step(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.model(x).float().pow(2).mean()
        self.optimizer.zero_grad()
        self.grad_scaler.scale(loss).backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        for hook in self.hooks:
            hook.after_step()
"""

HOOKS = """from train_loop import HookBase


class LRScheduler(HookBase):
    def __init__(self, scheduler):
        self.scheduler = scheduler

    def after_step(self):
        self.scheduler.step()
"""

HOOKED_SCRIPT = """import torch

from hooks import LRScheduler
from train_loop import AMPTrainer


def main(batches):
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 2)
    trainer = AMPTrainer(model, optimizer, [LRScheduler(scheduler)])
    for x in batches:
        trainer.run_step(x)
"""


def test_a_trainer_joined_with_its_hooks_says_its_builder_was_not_seen():
    """detectron2's layout: hooks.py derives from the loop's ``HookBase`` and main.py builds
    the trainer; the loop file is analysed with the hooks only, and its refusal says so
    instead of leaving "not built in this file" as the only reason."""
    results = migrate_project({"train_loop.py": HOOKED_LOOP, "hooks.py": HOOKS, "main.py": HOOKED_SCRIPT})
    assert not any(result.changed for result in results.values())
    notes = [d.message for d in results["train_loop.py"].diagnostics if d.code == "RPM110"]
    assert notes == [
        "analysed as one module with hooks.py only (a file is analysed in one such group): what main.py "
        "builds from it or hands it is not followed; left unchanged"
    ]


SEG_TRAINER = """import torch


class SegTrainer:
    def __init__(self):
        self.network = torch.nn.Linear(3, 1)
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.1)
        self.grad_scaler = torch.amp.GradScaler("cpu")

    def train_step(self, x):
        self.optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = self.network(x).float().pow(2).mean()
        self.grad_scaler.scale(loss).backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
"""

SEG_SCRIPT = """import torch

from seg_trainer import SegTrainer


def main(batches):
    trainer = SegTrainer()
    trainer.grad_scaler = torch.amp.GradScaler("cpu", init_scale=8.0)
    for x in batches:
        trainer.train_step(x)
"""


def test_a_trainer_refused_for_its_script_is_not_left_silent():
    """nnU-Net's layout: the script touches the trainer's scaler from outside and is refused;
    the trainer's file, analysed with it, says why it is left unchanged too."""
    results = migrate_project({"seg_trainer.py": SEG_TRAINER, "main.py": SEG_SCRIPT})
    assert not any(result.changed for result in results.values())
    blocker = next(d for d in results["main.py"].diagnostics if not d.is_info)
    (named,) = results["seg_trainer.py"].diagnostics
    assert named.code == "RPM110"
    assert f"main.py:{blocker.line} ({blocker.code})" in named.message
