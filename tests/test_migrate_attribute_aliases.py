"""A trainer's objects reached through other names (issue 10, shapes 1 and 8): the step
written on locals read from the attributes (``opt, sched = self.opt, self.sched``), the
optimizer built on the constructor's parameter next to ``self.model = model``, the scaler
built in either branch of an ``if``, and a factory choosing the optimizer class by a string
given ``self.model``. The ``--exact`` migration prints the original's numbers; the default
one runs as many steps."""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import torch


def param_groups(model, wd):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith("bias") else decay).append(p)
    return [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]


def create_optimizer(cfg, model):
    opt_class = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[cfg["name"]]
    return opt_class(param_groups(model, 0.05), lr=cfg["lr"])


class Trainer:
    def __init__(self, model, kind, dynamic):
        self.model = model
        self.opt = OPTIMIZER
        self.sched = torch.optim.lr_scheduler.StepLR(self.opt, step_size=2, gamma=0.5)
        if dynamic:
            self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
        else:
            self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**5, growth_interval=10**9)

    def set_lr(self, lr):
        for group in self.opt.param_groups:
            group["lr"] = lr

    def train_step(self, x, y):
        opt, sched = self.opt, self.sched
        scaler = self.scaler
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(self.model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        sched.step()
        return loss.item()


torch.manual_seed(0)
trainer = Trainer(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Linear(8, 2)), KIND, DYNAMIC)
gen = torch.Generator().manual_seed(3)
for step in range(5):
    if step == 3:
        trainer.set_lr(0.01)
    x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
    print(f"step {step} loss {trainer.train_step(x, y)!r}")
print(f"final scale {trainer.scaler.get_scale()!r}")
"""


ON_THE_PARAMETER = "torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)"
BY_THE_FACTORY = 'create_optimizer({"name": KIND, "lr": 0.02}, self.model)'


@pytest.mark.parametrize(
    "optimizer,kind,dynamic",
    [(ON_THE_PARAMETER, None, True), (BY_THE_FACTORY, "adamw", True), (BY_THE_FACTORY, "sgd", False)],
    ids=["constructor", "factory", "fixed"],
)
def test_trainer_aliases_train_the_same_after_migration(optimizer, kind, dynamic, tmp_path):
    source = SCRIPT.replace("OPTIMIZER", optimizer).replace("KIND", repr(kind)).replace("DYNAMIC", repr(dynamic))
    original = run_script(source, tmp_path, "original.py")
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    if optimizer == ON_THE_PARAMETER:
        assert "self.opt = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)" in exact.migrated
    else:
        assert "self.opt = self.model.adopt_optimizer(create_optimizer(" in exact.migrated
    assert exact.migrated.count("roundpipe.GradScaler(") == 2
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py")
    set_lr = default.migrated.split("def set_lr")[1].split("def train_step")[0]
    assert "self.model.synchronize()" in set_lr  # the other method's lr write waits for the running step
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == original.count("step ") == 5


def test_a_local_bound_again_stays_refused():
    source = SCRIPT.replace("OPTIMIZER", BY_THE_FACTORY).replace("KIND", '"adamw"').replace("DYNAMIC", "True")
    source = source.replace(
        "        scaler = self.scaler\n",
        "        scaler = self.scaler\n        if x is None:\n            opt = None\n",
    )
    result = migrate_source(source, "train.py", exact=True)
    assert [d.code for d in result.diagnostics] == ["RPM108"] and result.migrated == source
