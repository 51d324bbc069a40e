"""Trainer classes (issue 10, shape 1): objects held on ``self`` are followed through the
methods of their class (migrate/attributes.py, rule migrate/rules/trainer_class.py).

The migrated trainers run: with ``--exact`` they print the original's numbers, in the fused
and in the autograd form; the default (asynchronous) migration runs as many steps and waits
for the running step before another method writes optimizer state. Every refusal names the
statement that blocks.
"""

import re

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

STEP = re.compile(r"^step \d+ loss \S+", re.M)

FUSED = """
import io

import torch
import torch.nn.functional as F


class Base:
    def clip(self):
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)


class Trainer(Base):
    def __init__(self, lr=0.05):
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        self.steps = 0

    def train_step(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = self.model(x)
            loss = F.cross_entropy(out, y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.steps += 1
        return loss.detach()

    def set_lr(self, lr):
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def state_dict(self):
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
        }

    def load_state_dict(self, state):
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(8)]
    trainer = Trainer()
    for x, y in batches[:4]:
        print(f"step {trainer.steps} loss {trainer.train_step(x, y).item()!r}")
    trainer.set_lr(0.02)
    buffer = io.BytesIO()
    torch.save(trainer.state_dict(), buffer)
    buffer.seek(0)
    resumed = Trainer()
    resumed.load_state_dict(torch.load(buffer))
    for x, y in batches[4:]:
        print(f"step {resumed.steps} loss {resumed.train_step(x, y).item()!r}")
    print(f"final scale {resumed.scaler.get_scale()!r}")


main()
"""

AUTOGRAD = """
import torch


class Trainer:
    def __init__(self, amp):
        self.net = torch.nn.Sequential(torch.nn.Linear(5, 9), torch.nn.Tanh(), torch.nn.Linear(9, 1))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=3) if amp else None

    def train_step(self, x, y):
        self.opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.grad_scaler is not None):
            out = self.net(x)
        loss = torch.nn.functional.mse_loss(out.float(), y)
        if not torch.isfinite(loss):
            raise FloatingPointError("loss is not finite")
        if self.grad_scaler is not None:
            self.grad_scaler.scale(loss).backward()
            self.grad_scaler.unscale_(self.opt)
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), 2.0)
            self.grad_scaler.step(self.opt)
            self.grad_scaler.update()
        else:
            loss.backward()
            self.opt.step()
        return loss.item()


def main(amp):
    torch.manual_seed(1)
    gen = torch.Generator().manual_seed(5)
    trainer = Trainer(amp)
    for step in range(8):
        x, y = torch.randn(10, 5, generator=gen), torch.randn(10, 1, generator=gen)
        print(f"step {step} loss {trainer.train_step(x, y)!r}")
    scale = trainer.grad_scaler.get_scale() if trainer.grad_scaler is not None else None
    print(f"final scale {scale!r}")


main(True)
main(False)
"""


def _migrated(source: str, exact: bool) -> str:
    result = migrate_source(source, "trainer.py", exact=exact)
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    assert migrate_source(result.migrated, "trainer.py", exact=exact).migrated == result.migrated  # idempotent
    return result.migrated


@pytest.mark.parametrize("source", ["FUSED", "AUTOGRAD", "SPLIT"], ids=["fused", "autograd", "split"])
def test_migrated_trainer_prints_the_original_numbers(source, tmp_path):
    source = globals()[source]  # SPLIT is defined further down, with its own tests
    original = run_script(source, tmp_path, "original.py")
    assert len(STEP.findall(original)) >= 8
    assert run_script(_migrated(source, exact=True), tmp_path, "exact.py") == original
    lagged = run_script(_migrated(source, exact=False), tmp_path, "default.py")
    assert len(STEP.findall(lagged)) == len(STEP.findall(original))


def test_the_step_takes_the_form_its_method_allows():
    fused = _migrated(FUSED, exact=True)
    assert "self.model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)" in fused
    assert "self.model = roundpipe.RoundPipe(\n            torch.nn.Sequential(" in fused
    assert "self.optimizer = torch.optim.AdamW(self.model.optim_parameters(), lr=lr)" in fused
    assert "torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)" in fused  # Base.clip: never called
    autograd = _migrated(AUTOGRAD, exact=True)
    assert "            out = self.net(x)\n" in autograd and "self.grad_scaler.scale(loss).backward()" in autograd
    assert (
        "self.net.step(_step_fn, is_async=False)" in autograd
        and "self.net.step(_step_fn_2, is_async=False)" in autograd
    )


def test_checkpoint_methods_go_through_the_wrapped_module_after_synchronize():
    migrated = _migrated(FUSED, exact=True)
    assert (
        '        self.model.synchronize()\n        return {\n            "model": self.model.model.state_dict(),'
        in migrated
    )
    assert '        self.model.synchronize()\n        self.model.model.load_state_dict(state["model"])' in migrated


def test_asynchronously_other_methods_wait_for_the_running_step_before_writing_optimizer_state():
    lagged = _migrated(FUSED, exact=False)
    assert "    def set_lr(self, lr):\n        self.model.synchronize()\n        for group in" in lagged
    assert "self.model.synchronize()\n        self.optimizer.load_state_dict(" in lagged
    assert "self.model.synchronize()" not in _migrated(FUSED, exact=True).split("def set_lr")[1].split("def ")[0]
    autograd = _migrated(AUTOGRAD, exact=False)  # the step method runs once per step: all of it follows one
    assert "    def train_step(self, x, y):\n        self.net.synchronize()\n        self.opt.zero_grad()\n" in autograd


def _refused(source: str, line: int, *words: str) -> None:
    result = migrate_source(source, "trainer.py")
    assert result.migrated == source
    assert [(d.line, d.code) for d in result.diagnostics] == [(line, "RPM120")], [
        d.format() for d in result.diagnostics
    ]
    for word in words:
        assert word in result.diagnostics[0].message


def _line(source: str, text: str) -> int:
    return source[: source.index(text)].count("\n") + 1


REFUSALS = {
    "bound twice": (
        FUSED.replace(
            "    def set_lr(self, lr):\n",
            "    def reset(self):\n        self.scaler = None\n\n    def set_lr(self, lr):\n",
        ),
        "        self.scaler = None",
        ("`self.scaler = None`", "bound more than once"),
    ),
    "not a plain assignment": (
        FUSED.replace(
            "        self.scheduler = torch", "        self.opt2 = self.optimizer\n        self.scheduler = torch"
        ).replace(
            "        self.optimizer = torch.optim.AdamW(", "        self.optimizer = self.backup = torch.optim.AdamW("
        ),
        "        self.optimizer = self.backup",
        ("other than by a plain assignment",),
    ),
    "optimizer outside __init__": (
        FUSED.replace(
            "        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)\n"
            "        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)\n",
            "        self.build(lr)\n",
        ).replace(
            "    def train_step(self, x, y):\n",
            "    def build(self, lr):\n        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)\n"
            "        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)\n\n"
            "    def train_step(self, x, y):\n",
        ),
        "        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)",
        ("outside Trainer.__init__",),
    ),
    "model handed in": (
        FUSED.replace(
            "    def __init__(self, lr=0.05):\n        self.model = torch.nn.Sequential(",
            "    def __init__(self, lr=0.05, model=None):\n        self.model = model or torch.nn.Sequential(",
        ),
        "        self.model = model or",
        ("not built in Trainer.__init__",),
    ),
    "instance named otherwise": (
        FUSED.replace(
            "    def set_lr(self, lr):\n        for group in self.optimizer",
            "    def set_lr(this, lr):\n        for group in this.optimizer",
        ),
        "        for group in this.optimizer",
        ("`this.optimizer` names the instance differently",),
    ),
    "scaler stepped from outside": (
        FUSED.replace("    trainer.set_lr(0.02)\n", "    trainer.set_lr(0.02)\n    trainer.scaler.update(4.0)\n"),
        "    trainer.scaler.update(4.0)",
        ("from outside the class",),
    ),
    "attribute replaced from outside": (
        FUSED.replace("    trainer.set_lr(0.02)\n", "    trainer.set_lr(0.02)\n    trainer.optimizer = None\n"),
        "    trainer.optimizer = None",
        ("`trainer.optimizer = None`", "from outside the class"),
    ),
    "model stored from outside": (  # read as `trainer.model.eval()` it migrates (test_migrate_outside_trainer_reads)
        FUSED.replace("    trainer.set_lr(0.02)\n", "    trainer.set_lr(0.02)\n    models = [trainer.model]\n"),
        "    models = [trainer.model]",
        ("from outside the class",),
    ),
    "base class of another file": (
        FUSED.replace("import io\n", "import io\n\nfrom hooks import LoggingMixin\n").replace(
            "class Trainer(Base):", "class Trainer(Base, LoggingMixin):"
        ),
        "class Trainer(Base, LoggingMixin):",
        ("derives from `LoggingMixin`",),
    ),
    "scaler injected": (
        FUSED.replace("    def __init__(self, lr=0.05):", "    def __init__(self, lr=0.05, scaler=None):")
        .replace(
            '        self.scaler = torch.amp.GradScaler("cpu"',
            '        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu"',
        )
        .replace("    resumed = Trainer()\n", "    resumed = Trainer(scaler=trainer.scaler)\n"),
        "    resumed = Trainer(scaler=trainer.scaler)",
        ("hands Trainer `trainer.scaler` as its scaler", "cannot follow"),
    ),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_a_trainer_the_rules_cannot_account_for_is_refused_at_the_statement(name):
    source, text, words = REFUSALS[name]
    assert source != FUSED
    _refused(source, _line(source, text), *words)


INJECTED = FUSED.replace("    def __init__(self, lr=0.05):", "    def __init__(self, lr=0.05, scaler=None):").replace(
    '        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)\n',
    '        if scaler is None:\n            scaler = torch.amp.GradScaler("cpu")\n        self.scaler = scaler\n',
)


@pytest.mark.parametrize(
    "main",
    [
        "    trainer = Trainer()\n",
        '    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)\n    trainer = Trainer(scaler=scaler)\n',
    ],
    ids=["built when none is given", "handed in by the caller"],
)
def test_an_injected_scaler_becomes_roundpipes_wherever_every_construction_shows_it(main, tmp_path):
    source = INJECTED.replace("    trainer = Trainer()\n", main)
    migrated = _migrated(source, exact=True)
    assert "scaler = roundpipe.GradScaler(" in migrated and "torch.amp.GradScaler" not in migrated
    assert run_script(migrated, tmp_path, "exact.py") == run_script(source, tmp_path, "original.py")


def test_an_injected_scaler_of_a_class_built_elsewhere_is_refused_at_its_binding():
    source = INJECTED.replace("\n\nmain()\n", "\n").replace("    trainer = Trainer()\n", "    trainer = make()\n")
    source = source[: source.index("def main():")]  # the class is built in no function of this file
    _refused(source, _line(source, "        self.scaler = scaler\n"), "`self.scaler = scaler`", "does not see")


def test_read_only_scaler_uses_from_outside_are_fine_and_other_classes_attributes_are_their_own():
    logger = "class Logger:\n    def __init__(self):\n        self.model = 'mlp'\n\n    def log(self):\n"
    source = FUSED.replace("def main():\n", logger + "        print(self.model)\n\n\ndef main():\n").replace(
        "    trainer.set_lr(0.02)\n",
        "    trainer.set_lr(0.02)\n    assert trainer.scaler.is_enabled() and trainer.scaler is not None\n",
    )
    assert "print(self.model)" in _migrated(source, exact=True)


SPLIT = """
import torch


class BackwardMixin:
    def backward(self, loss):
        self.grad_scaler.scale(loss).backward()


class UpdateMixin:
    def update_params(self):
        self.grad_scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        self.optimizer.zero_grad()
        self.scheduler.step()
        return norm


class Trainer(BackwardMixin, UpdateMixin):
    def __init__(self, clip=0.5):
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.5)
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
        self.clip = clip
        self.iter = 0

    def run_step(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            losses = {"ce": torch.nn.functional.cross_entropy(self.model(x).float(), y)}
        loss = sum(losses.values())
        self.backward(loss)
        norm = self.update_params()
        self.iter += 1
        return loss.detach(), norm


def main():
    torch.manual_seed(2)
    gen = torch.Generator().manual_seed(7)
    trainer = Trainer()
    for _ in range(8):
        loss, norm = trainer.run_step(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen))
        print(f"step {trainer.iter} loss {loss.item()!r} norm {norm.item()!r}")
    print(f"final scale {trainer.grad_scaler.get_scale()!r}")


main()
"""


def test_a_step_split_over_methods_takes_the_autograd_form_in_the_optimizer_method():
    migrated = _migrated(SPLIT, exact=False)
    assert "    def backward(self, loss):\n        self.grad_scaler.scale(loss).backward()\n" in migrated
    assert (
        "            norm = torch.nn.utils.clip_grad_norm_(self.model.optim_parameters(), self.clip)\n"
        "            self.grad_scaler.step(self.optimizer)\n"
        "            self.optimizer.zero_grad()\n            self.scheduler.step()\n\n"
        "        self.model.step(_step_fn, is_async=False)\n        self.grad_scaler.update()\n        return norm\n"
    ) in migrated  # the norm is read on the main thread: the step is waited for
    assert "        self.backward(loss)\n        norm = self.update_params()\n" in migrated
    result = migrate_source(SPLIT, "trainer.py")
    assert any("another method (UpdateMixin.update_params())" in r.description for r in result.rewrites)


HANDED = SPLIT.replace(
    """    def __init__(self, clip=0.5):
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
""",
    """    def __init__(self, model, optimizer, clip=0.5):
        self.model = model
        self.optimizer = optimizer
""",
).replace(
    "    trainer = Trainer()\n",
    "    net = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU(), torch.nn.Linear(12, 3))\n"
    "    trainer = Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9), clip=0.5)\n",
)


def test_a_model_and_optimizer_handed_to_the_constructor_are_wrapped_where_the_caller_builds_them(tmp_path):
    migrated = _migrated(HANDED, exact=True)
    assert (
        "    net = roundpipe.RoundPipe(net, model_run_config=roundpipe.RoundPipeRunConfig("
        "num_microbatch=NUM_MICROBATCH))\n"
        "    trainer = Trainer(net, torch.optim.SGD(net.optim_parameters(), lr=0.1, momentum=0.9), clip=0.5)\n"
    ) in migrated
    assert "        self.model.step(_step_fn, is_async=False)\n" in migrated
    original = run_script(HANDED, tmp_path, "original.py")
    assert run_script(migrated, tmp_path, "exact.py") == original
    assert len(STEP.findall(run_script(_migrated(HANDED, exact=False), tmp_path, "default.py"))) == 8


def test_the_result_names_the_classes_followed_through_their_constructions():
    # the whole family: a construction of any of them elsewhere runs the followed __init__
    assert migrate_source(HANDED, "trainer.py", exact=True).handed_classes == [
        "BackwardMixin",
        "Trainer",
        "UpdateMixin",
    ]
    assert migrate_source(FUSED, "trainer.py", exact=True).handed_classes == []


@pytest.mark.parametrize(
    "old, new, blocker",
    [
        (
            "        self.optimizer = optimizer\n",
            "        self.optimizer = optimizer\n        print(model)\n",
            "`model`",
        ),
        ("    trainer = Trainer(net,", "    make = Trainer\n    trainer = make(net,", "`make = Trainer`"),
        ("        self.model = model\n", "        self.model = torch.nn.Linear(6, 3)\n", "no attribute"),
    ],
    ids=["parameter used twice", "class aliased", "another model stepped"],
)
def test_what_a_constructor_is_handed_is_followed_only_where_every_construction_shows_it(old, new, blocker):
    source = HANDED.replace(old, new, 1)
    assert source != HANDED
    result = migrate_source(source, "trainer.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics if blocker in d.message][:1] == ["RPM108"], [
        d.format() for d in result.diagnostics
    ]


@pytest.mark.parametrize(
    "old, new, blocker",
    [
        (
            "        self.backward(loss)\n",
            "        self.optimizer.zero_grad()\n        self.backward(loss)\n",
            "zero_grad",
        ),
        (
            "        return norm\n",
            "        return norm\n\n    def extra_step(self):\n        self.grad_scaler.step(self.optimizer)\n",
            "backward() ends with it",
        ),
    ],
    ids=["zero_grad elsewhere", "two optimizer methods"],
)
def test_a_split_step_the_rules_cannot_account_for_is_refused_at_the_backward_or_the_blocker(old, new, blocker):
    source = SPLIT.replace(old, new, 1)
    result = migrate_source(source, "trainer.py")
    assert result.migrated == source
    assert [d.code for d in result.diagnostics if blocker in d.message][:1] == ["RPM106"], [
        d.format() for d in result.diagnostics
    ]


def test_a_zero_grad_outside_the_optimizer_method_is_refused_at_the_call():
    source = SPLIT.replace(
        "        self.backward(loss)\n", "        self.optimizer.zero_grad()\n        self.backward(loss)\n", 1
    )
    line = source.splitlines().index("        self.backward(loss)")  # the line before it, 1-based
    result = migrate_source(source, "trainer.py")
    assert (
        f"trainer.py:{line}:9: RPM106 `self.optimizer.zero_grad()` empties gradients outside the optimizer "
        "method of a step split over methods of Trainer; the step function cannot keep it in its place; left "
        "untouched" in [d.format() for d in result.diagnostics]
    )


def _project(main: str):
    from migrate.project import migrate_project

    trainer = FUSED.replace("\n\nmain()\n", "\n")
    return migrate_project({"trainer.py": trainer, "main.py": main}, exact=True)


def test_a_trainer_of_another_file_migrates_when_its_users_only_call_it():
    results = _project("from trainer import Trainer\n\nt = Trainer()\nprint(t.scaler.get_scale())\n")
    assert results["trainer.py"].status == "migrated"
    assert [d.code for d in results["trainer.py"].diagnostics] == []


def test_a_file_reading_a_trainers_model_through_an_instance_is_migrated_with_the_class():
    results = _project("from trainer import Trainer\n\nt = Trainer()\nt.model.eval()\n")  # analysed as one
    assert [d.code for r in results.values() for d in r.diagnostics] == []
    assert results["main.py"].migrated.endswith("t = Trainer()\nt.model.synchronize()\nt.model.eval()\n")


def test_a_trainer_whose_model_another_file_reads_through_an_instance_is_refused():
    results = _project("import trainer\n\nt = trainer.Trainer()\nprint(t.model.state_dict())\n")  # not joined
    trainer = results["trainer.py"]
    assert trainer.migrated == trainer.original
    assert [(d.code, d.line) for d in trainer.diagnostics] == [("RPM110", _line(trainer.original, "class Trainer("))]
    assert "main.py:4 reads it" in trainer.diagnostics[0].message


def test_a_trainer_handing_itself_to_a_function_of_another_file_is_refused():
    from migrate.project import migrate_project

    trainer = FUSED.replace("\n\nmain()\n", "\n").replace("import io\n", "import io\n\nfrom hooks import after_step\n")
    trainer = trainer.replace("        self.steps += 1\n", "        self.steps += 1\n        after_step(self)\n")
    results = migrate_project({"trainer.py": trainer, "hooks.py": "def after_step(t):\n    t.model.eval()\n"}, True)
    assert results["trainer.py"].migrated == trainer
    assert [d.code for d in results["trainer.py"].diagnostics] == ["RPM110"]


def test_a_model_used_before_its_optimizer_is_built_is_wrapped_right_before_it():
    source = FUSED.replace(
        "        self.optimizer = torch.optim.AdamW(",
        "        self.model.apply(lambda m: None)\n        self.optimizer = torch.optim.AdamW(",
    )
    migrated = _migrated(source, exact=True)
    wrap = "        self.model = roundpipe.RoundPipe(\n            self.model,\n            model_run_config="
    assert "        self.model.apply(lambda m: None)\n" + wrap in migrated


def test_names_that_cannot_hold_an_instance_are_not_uses_of_its_attributes():
    source = FUSED.replace(
        "def main():\n",
        "def describe(args):\n    print(args.model, args.optimizer)\n\n\ndef main():\n",
    ).replace(
        "    trainer.set_lr(0.02)\n",
        "    trainer.set_lr(0.02)\n    describe(argparse.Namespace(model='mlp', optimizer='adamw'))\n",
    )
    source = source.replace("import io\n", "import argparse\nimport io\n")
    assert "print(args.model, args.optimizer)" in _migrated(source, exact=True)
    handed = source.replace(
        "    describe(argparse.Namespace(model='mlp', optimizer='adamw'))\n", "    describe(trainer)\n"
    )
    _refused(handed, _line(handed, "    print(args.model, args.optimizer)"), "from outside the class")


def test_a_step_whose_backward_reaches_a_second_wrapped_model_is_refused():
    gan = """import torch


class GAN:
    def __init__(self):
        self.G = torch.nn.Linear(2, 2)
        self.opt_g = torch.optim.Adam(self.G.parameters())
        self.D = torch.nn.Linear(2, 1)
        self.opt_d = torch.optim.Adam(self.D.parameters())
        self.scaler_g = torch.amp.GradScaler("cuda")
        self.scaler_d = torch.amp.GradScaler("cuda")

    def d_step(self, real):
        loss = self.D(real).mean()
        self.scaler_d.scale(loss).backward()
        self.scaler_d.step(self.opt_d)
        self.scaler_d.update()

    def g_step(self, z):
        loss = -self.D(self.G(z)).mean()
        self.scaler_g.scale(loss).backward()
        self.scaler_g.step(self.opt_g)
        self.scaler_g.update()
"""
    result = migrate_source(gan, "gan.py")
    assert result.migrated == gan
    assert [(d.code, d.line) for d in result.diagnostics] == [("RPM107", _line(gan, "        loss = -self.D("))]
    assert "calls self.D with gradients" in result.diagnostics[0].message  # zero_grad() after the steps only
    assert (
        migrate_source(
            gan.replace("        loss = -self.D(self.G(z)).mean()\n", "        loss = self.G(z).mean()\n"), "gan.py"
        ).status
        == "migrated"
    )


def test_a_model_handed_in_and_moved_to_a_device_is_refused():
    source = FUSED.replace("    def __init__(self, lr=0.05):", "    def __init__(self, net, lr=0.05):").replace(
        "        self.model = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(), torch.nn.Linear(12, 3))\n",
        '        self.model = net.to("cpu")\n',
    )
    _refused(source, _line(source, '        self.model = net.to("cpu")'), "not built in Trainer.__init__")


def test_an_instance_model_handed_to_another_trainer_is_named_as_written():
    """``ModelEmaV2(self.model)`` in a method of the trainer: the refusal names the model as
    the file spells it, ``self.model`` (it showed the repr of the libcst node of ``self``)."""
    source = FUSED.replace(
        "    def set_lr(self, lr):\n",
        "    def make_ema(self):\n        self.ema = ModelEmaV2(self.model)\n\n    def set_lr(self, lr):\n",
    )
    result = migrate_source(source, "trainer.py")
    assert result.migrated == source
    assert [(d.line, d.code) for d in result.diagnostics] == [(_line(source, "        self.ema ="), "RPM114")]
    assert "the wrapped model 'self.model' is handed to `ModelEmaV2(...)`: an EMA copy" in result.diagnostics[0].message


BUILTIN_NAMES = {
    "base class object": FUSED.replace("class Base:", "class Base(object):"),
    "None passed for a holder": FUSED.replace(
        "\n\nmain()\n",
        "\n\ndef has_model(holder):\n    return holder is not None and holder.model is not None\n\n\n"
        "print(has_model(None))\nmain()\n",
    ),
    "a builtin's result": FUSED.replace(
        "\n\nmain()\n", "\n\nholder = len([])\nprint(holder.model if holder else 0)\nmain()\n"
    ),
}


@pytest.mark.parametrize("name", sorted(BUILTIN_NAMES))
def test_builtin_names_near_a_trainer_are_no_instances_of_it(name, tmp_path):
    """``class Base(object)``, ``has_model(None)``, ``len(...)``: libcst answers a builtin,
    with no node, for names the file never binds; they are followed as what they are (no
    class of the file, no instance of it) and the trainer migrates (each crashed with RPM904)."""
    source = BUILTIN_NAMES[name]
    assert source != FUSED
    assert run_script(_migrated(source, exact=True), tmp_path, "exact.py") == run_script(
        source, tmp_path, "original.py"
    )


MIXINS = HANDED[: HANDED.index("class Trainer(")]  # the mixins, in a file of their own
SUBCLASS = (
    "import torch\n\nfrom hooks import BackwardMixin, UpdateMixin\n\n\n" + HANDED[HANDED.index("class Trainer(") :]
)


def _run_project(files, tmp_path, name: str) -> str:
    import sys

    folder = tmp_path / name
    folder.mkdir()
    for path, text in files.items():
        (folder / path).write_text(text)
    sys.path.insert(0, str(folder))
    try:
        return run_script((folder / "main.py").read_text(), folder, "main.py")
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("hooks", None)


def _migrate_files(files, exact: bool):
    from migrate.project import migrate_project

    return migrate_project(files, exact=exact)


def test_mixins_of_another_file_are_analysed_with_their_subclass_and_print_the_same_numbers(tmp_path):
    files = {"hooks.py": MIXINS, "main.py": SUBCLASS}
    exact = _migrate_files(files, exact=True)
    assert [r.status for r in exact.values()] == ["migrated", "migrated"], [
        d.format() for r in exact.values() for d in r.diagnostics
    ]
    assert "self.model.step(_step_fn, is_async=False)" in exact["hooks.py"].migrated
    assert "import roundpipe" not in exact["hooks.py"].migrated  # it reads nothing of roundpipe
    assert "import roundpipe\n" in exact["main.py"].migrated and "NUM_MICROBATCH = 1" in exact["main.py"].migrated
    lines = {_line(MIXINS, "        self.grad_scaler.scale(loss)"), _line(MIXINS, "        self.grad_scaler.unscale_")}
    assert {r.line for r in exact["hooks.py"].rewrites} == lines  # the lines of hooks.py, not of the joined module
    migrated = {path: result.migrated for path, result in exact.items()}
    original = _run_project(files, tmp_path, "original")
    assert _run_project(migrated, tmp_path, "exact") == original
    lagged = {path: result.migrated for path, result in _migrate_files(files, exact=False).items()}
    assert len(STEP.findall(_run_project(lagged, tmp_path, "default"))) == len(STEP.findall(original)) == 8
    again = _migrate_files(migrated, exact=True)  # idempotent, and silent
    assert all(not r.changed and not r.diagnostics for r in again.values())


def test_a_blocker_of_joined_files_is_reported_in_its_own_file_at_its_own_line():
    main = SUBCLASS.replace(
        "        self.backward(loss)\n", "        self.optimizer.zero_grad()\n        self.backward(loss)\n"
    )
    results = _migrate_files({"hooks.py": MIXINS, "main.py": main}, exact=True)
    assert not any(r.changed for r in results.values())
    assert [(d.code, d.line) for d in results["main.py"].diagnostics] == [
        ("RPM106", _line(main, "        self.optimizer.zero_grad()\n"))
    ]


def test_files_that_bind_one_name_each_for_itself_are_joined_with_the_name_kept_apart(tmp_path):
    mixins = MIXINS + "\n\ndef main():\n    pass\n"  # main.py has its own main()
    files = {"hooks.py": mixins, "main.py": SUBCLASS}
    results = _migrate_files(files, exact=True)
    assert [r.status for r in results.values()] == ["migrated", "migrated"]
    assert results["hooks.py"].migrated.endswith("\n\ndef main():\n    pass\n")
    migrated = {path: result.migrated for path, result in results.items()}
    assert _run_project(migrated, tmp_path, "exact") == _run_project(files, tmp_path, "original")


def test_files_that_bind_one_name_by_different_imports_are_not_joined():
    mixins = "import torch.nn as nn\n" + MIXINS
    subclass = "from torch import nn\n" + SUBCLASS
    results = _migrate_files({"hooks.py": mixins, "main.py": subclass}, exact=True)
    assert not any(r.changed for r in results.values())
    assert "RPM120" in [d.code for d in results["main.py"].diagnostics]


_BUILDS_IN_MAIN = (
    "def main():\n    net = torch.nn.Linear(6, 3)\n    Trainer(net, torch.optim.SGD(net.parameters(), lr=0.1))\n"
)


@pytest.mark.parametrize(
    "other, trainer_head, migrated",
    [
        ("net = torch.nn.Linear(6, 3)\nTrainer(net, torch.optim.SGD(net.parameters(), lr=0.1))\n", "", True),
        (_BUILDS_IN_MAIN, "", True),  # each file's main() kept apart while joined
        ("from torch import nn\n" + _BUILDS_IN_MAIN, "import torch.nn as nn\n", False),
    ],
    ids=["joined with its builder", "joined, each main() its own", "builder not joinable"],
)
def test_a_trainer_handed_objects_is_migrated_with_every_file_that_builds_it_or_not_at_all(
    other, trainer_head, migrated
):
    trainer = trainer_head + HANDED.replace("\n\nmain()\n", "\n")
    other = "import torch\n\nfrom trainer import Trainer\n\n" + other
    results = _migrate_files({"trainer.py": trainer, "other.py": other}, exact=True)
    if migrated:
        assert "net = roundpipe.RoundPipe(net, " in results["other.py"].migrated
        assert all(r.status == "migrated" for r in results.values())
    else:  # the two files bind `nn` by different imports: what other.py hands Trainer() is not followed
        assert not any(r.changed for r in results.values())
        assert [d.code for d in results["trainer.py"].diagnostics] == ["RPM110"]
        message = results["trainer.py"].diagnostics[0].message
        assert "Trainer() is built in other.py" in message and "the top-level name `nn`" in message


def test_joined_files_keep_their_future_imports_where_they_were(tmp_path):
    future = "from __future__ import annotations\n\n"
    files = {"hooks.py": future + MIXINS, "main.py": '"""Trainer."""\n' + future + SUBCLASS}
    results = _migrate_files(files, exact=True)
    assert [r.status for r in results.values()] == ["migrated", "migrated"]
    assert results["hooks.py"].migrated.startswith(future)
    assert results["main.py"].migrated.startswith(
        '"""Trainer."""\nfrom __future__ import annotations\n\nimport roundpipe\n'
    )
    migrated = {path: result.migrated for path, result in results.items()}
    assert _run_project(migrated, tmp_path, "exact") == _run_project(files, tmp_path, "original")
