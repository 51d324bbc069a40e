"""Project helpers working on gradients between the backward and the step (issue 10, shapes
7 and 9; migrate.gradient_helpers): DINO's ``clip_gradients(model, clip)`` returning the
per-parameter norms and ``cancel_gradients_last_layer`` dropping some gradients, timm's
``dispatch_clip_grad(model.parameters(), value, mode)``. The migrated program prints the
original's numbers under --exact (the logged norms included) and as many steps by default;
a helper doing more than gradient work is refused with RPM158 naming what it touches."""

import re

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

HELPERS = """
import torch
import torch.nn.functional as F


def clip_gradients(model, clip):
    norms = []
    for p in model.parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for name, p in model.named_parameters():
        if "last" in name:
            p.grad = None


def dispatch_clip_grad(parameters, value, mode="norm"):
    if mode == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, value)
    elif mode == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    else:
        raise ValueError(f"unknown clip mode {mode}")


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(6, 8)
        self.last = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.last(torch.relu(self.body(x)))


def batches():
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(10, 6, generator=gen) * 4, torch.randint(0, 3, (10,), generator=gen)) for _ in range(3)]
"""

DINO = (
    HELPERS
    + """

def train_one_epoch(model, optimizer, scaler, epoch):
    for it, (x, y) in enumerate(batches()):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        param_norms = clip_gradients(model, 0.05)
        cancel_gradients_last_layer(epoch, model, 1)
        scaler.step(optimizer)
        scaler.update()
        print(f"step {epoch} {it} loss {loss.item()!r} norms {param_norms!r}")


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
    for epoch in range(2):
        train_one_epoch(model, optimizer, scaler, epoch)
    print(f"last {model.last.weight.sum().item()!r} final scale {scaler.get_scale()!r}")


main()
"""
)

DISPATCH = (
    HELPERS
    + """

def main(mode):
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
    for step, (x, y) in enumerate(batches() * 2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        dispatch_clip_grad(model.parameters(), 0.01, mode=mode)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
    model.synchronize() if hasattr(model, "synchronize") else None
    print(f"weights {sum(p.sum().item() for p in model.parameters())!r} final scale {scaler.get_scale()!r}")


main(MODE)
"""
)

METHOD = """
import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.3)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)
        self.clip = 0.05

    def clip_grads(self):
        total = 0.0
        for p in self.model.parameters():
            if p.grad is not None:
                total += p.grad.norm().item()
                p.grad.mul_(min(1.0, self.clip / (p.grad.norm().item() + 1e-6)))
        return total

    def train_step(self, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(self.model(x).float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        total = self.clip_grads()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return loss.item(), total


trainer = Trainer()
gen = torch.Generator().manual_seed(5)
for step in range(5):
    x, y = torch.randn(10, 6, generator=gen) * 4, torch.randint(0, 3, (10,), generator=gen)
    print("step", step, *trainer.train_step(x, y))
print("final scale", trainer.scaler.get_scale())
"""

STEP = re.compile(r"^step ", re.M)


def _check(source: str, tmp_path, expected_fragment: str) -> None:
    original = run_script(source, tmp_path, "original.py")
    for exact in (True, False):
        result = migrate_source(source, "train.py", exact=exact)
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert expected_fragment in result.migrated
        migrated = run_script(result.migrated, tmp_path, f"migrated_{exact}.py")
        if exact:
            assert migrated == original
        else:
            assert len(STEP.findall(migrated)) == len(STEP.findall(original))


def test_a_helper_handed_the_model_runs_on_the_copies_and_its_norms_are_the_originals(tmp_path):
    original = run_script(DINO, tmp_path, "plain.py")
    assert "norms [" in original and original.count("step ") == 6
    fragment = (
        "with roundpipe.OptimizerCtx():\n                scaler.unscale_(optimizer)\n                param_norms ="
    )
    _check(DINO, tmp_path, fragment)


@pytest.mark.parametrize("mode", ["norm", "value"])
def test_a_helper_handed_the_parameters_clips_the_copies(mode, tmp_path):
    _check(DISPATCH.replace("MODE", repr(mode)), tmp_path, "dispatch_clip_grad(model.optim_parameters(), 0.01")


@pytest.mark.parametrize(
    "change,touch",
    [
        (("param_norm = p.grad.data.norm(2)", "param_norm = p.grad.data.norm(2) / p.data.norm()"), "reads the weights"),
        (("        return\n", "        print(epoch)\n        return\n"), "prints"),
        (('if "last" in name:', 'if name.startswith("last"):'), "reads the parameter names"),
        (("norms = []\n", "norms = []\n    model.train()\n"), "uses the model"),
        (("norms = []\n", "norms = [len(list(model.parameters()))]\n"), "uses the model"),
        (
            ("    return norms\n", "    return norms + [p.norm().item() for p in model.parameters()]\n"),
            "reads the weights",
        ),
    ],
    ids=["weights", "print", "names", "model", "counted", "comprehension"],
)
def test_a_helper_doing_more_than_gradient_work_is_refused_naming_it(change, touch):
    source = DINO.replace(*change)
    assert source != DINO
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    messages = [d.format() for d in result.diagnostics if d.code == "RPM158"]
    assert len(messages) == 1 and touch in messages[0], [d.format() for d in result.diagnostics]
    assert "clip_gradients()" in messages[0] or "cancel_gradients_last_layer()" in messages[0]


def test_a_method_walking_the_trainers_model_runs_on_the_copies(tmp_path):
    _check(METHOD, tmp_path, "with roundpipe.OptimizerCtx():\n                self.scaler.unscale_(self.optimizer)\n")


LOCALS = (
    HELPERS
    + """

class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = Net()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=2)

    def train_one_epoch(self, epoch):
        model = self.model
        optimizer = self.optimizer
        scaler = self.scaler
        for it, (x, y) in enumerate(batches()):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x).float(), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            param_norms = clip_gradients(model, 0.05)
            cancel_gradients_last_layer(epoch, model, 1)
            dispatch_clip_grad(model.parameters(), 0.5)
            scaler.step(optimizer)
            scaler.update()
            print(f"step {epoch} {it} loss {loss.item()!r} norms {param_norms!r}")


trainer = Trainer()
for epoch in range(2):
    trainer.train_one_epoch(epoch)
print(f"final scale {trainer.scaler.get_scale()!r}")
"""
)


def test_a_helper_handed_a_local_bound_to_the_trainers_model_runs_on_the_copies(tmp_path):
    """``model = self.model`` once in the method: ``clip_gradients(model, ...)`` hands the
    trained model (not RPM158), and the asynchronous step may read ``model`` late."""
    inner = "\n" + " " * 20
    fragment = f"with roundpipe.OptimizerCtx():{inner}scaler.unscale_(optimizer){inner}param_norms = clip_gradients("
    _check(LOCALS, tmp_path, fragment)
