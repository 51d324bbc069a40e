"""One rule for main-thread reads of the weights in the default (asynchronous) form.

The optimizer thread writes only its own copies; the model's weights are written from them
on the main thread (in ``model.step`` and ``model.synchronize``), so a main-thread read can
never see half a step. Inside a loop that trains, every read of the weights, whatever its
shape, is therefore one step stale and consistent, and gets no ``synchronize``. After
training (also in a method of a trainer class that the caller runs after a training method
returned) a read waits for the last step. Each program runs against a slowed optimizer step.
"""

import pytest
import torch

from migrate.engine import migrate_source
from script_runs import run_script

# The loss is linear in the weights, so its gradients do not depend on them: the default
# form's one-step-stale forwards reach the same weights as the original after the loop.
LOOP = """import torch


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    for x in [torch.ones(2, 4)] * 4:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().sum()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        READS


main()
"""

# Each read of the first weight, in the shapes real loops log it.
IN_LOOP_READS = (
    "float(model.weight.detach().sum())",
    "float(next(model.parameters()).detach().sum())",
    "float([p.data for p in model.parameters()][0].sum())",
    "float(list(model.parameters())[0].detach().sum())",
)


def _migrated(source: str) -> str:
    """The default migration of ``source``, checked to be idempotent and silent on itself."""
    result = migrate_source(source, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    again = migrate_source(result.migrated, "train.py")
    assert again.migrated == result.migrated and not again.diagnostics
    return result.migrated


def test_every_weight_read_in_a_training_loop_is_one_step_stale_alike(slow_step, tmp_path):
    reads = "\n        ".join(f'print("w", repr({read}))' for read in IN_LOOP_READS)
    source = LOOP.replace("READS", reads)
    migrated = _migrated(source)
    assert "synchronize" not in migrated
    printed = run_script(migrated, tmp_path, "async.py").split()
    weights = [printed[i + 1] for i, word in enumerate(printed) if word == "w"]
    assert len(weights) == 4 * len(IN_LOOP_READS) == run_script(source, tmp_path, "original.py").count("w ")
    per_step = [weights[i : i + len(IN_LOOP_READS)] for i in range(0, len(weights), len(IN_LOOP_READS))]
    assert all(len(set(step)) == 1 for step in per_step), per_step  # no read saw a newer step than another


TRAINER = """import torch


class Trainer:
    def __init__(self):
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 2)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.scaler = torch.amp.GradScaler("cpu")

    def fit(self, batches):
        for x in batches:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = self.model(x).float().sum()
            self.optimizer.zero_grad()
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            print("step", repr(loss.item()))

    def report(self):
        METHOD


def main():
    tr = Trainer()
    tr.fit([torch.ones(2, 4)] * 3)
    tr.report()


main()
"""

METHOD_READS = {
    "weight norm": 'print("norm", repr(float(self.model.weight.detach().norm())))',
    "first parameter": 'print("first", repr(float(next(self.model.parameters()).detach().sum())))',
    "forward with gradients": 'print("out", repr(float(self.model(torch.ones(1, 4)).detach().sum())))',
    "parameters in a loop": 'for p in self.model.parameters():\n            print("p", repr(float(p.detach().sum())))',
}


@pytest.mark.parametrize("read", METHOD_READS.values(), ids=METHOD_READS.keys())
def test_a_trainer_method_run_after_its_training_method_waits_for_the_last_step(read, slow_step, tmp_path):
    source = TRAINER.replace("METHOD", read)
    migrated = _migrated(source)
    report = migrated[migrated.index("    def report(self):") :]
    assert report.startswith("    def report(self):\n        self.model.synchronize()\n")
    assert migrated.count("synchronize()") == 1  # not in the training method
    original = run_script(source, tmp_path, "original.py").splitlines()
    asynchronous = run_script(migrated, tmp_path, "async.py").splitlines()
    assert len(asynchronous) == len(original) and asynchronous[3:] == original[3:]


def test_a_method_called_by_the_training_method_gets_no_synchronize():
    source = TRAINER.replace("METHOD", 'print("norm", repr(float(self.model.weight.detach().norm())))').replace(
        '            print("step", repr(loss.item()))',
        '            print("step", repr(loss.item()))\n            self.report()',
    )
    assert "synchronize" not in _migrated(source)


def test_the_exact_form_gets_no_synchronize_in_the_method():
    result = migrate_source(TRAINER.replace("METHOD", METHOD_READS["weight norm"]), "train.py", exact=True)
    assert result.status == "migrated" and "synchronize" not in result.migrated


CHECKPOINTS = {
    "every other step": (
        "if step % 2 == 1:\n"
        '            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),'
        ' "scaler": scaler.state_dict()}, PATH)'
    ),
    "on a new best loss": (
        "if loss.item() < best:\n            best = loss.item()\n"
        '            torch.save({"optimizer": optimizer.state_dict(), "model": model.state_dict()}, PATH)'
    ),
}


@pytest.mark.parametrize("save", CHECKPOINTS.values(), ids=CHECKPOINTS.keys())
def test_a_checkpoint_saved_in_the_training_loop_holds_one_steps_weights_and_optimizer_state(save, slow_step, tmp_path):
    def saved(source: str, name: str) -> dict:
        path = tmp_path / f"{name}.pt"
        run_script(source.replace("PATH", repr(str(path))), tmp_path, f"{name}.py")
        return torch.load(path, weights_only=False)

    loop = LOOP.replace("for x in", "best = float('inf')\n    for step, x in enumerate(").replace(" * 4:", " * 4):")
    source = loop.replace("lr=0.1)", "lr=0.1, momentum=0.9)").replace("READS", save)
    migrated = _migrated(source)
    assert migrated.count("model.synchronize()") == 1
    lines = migrated.splitlines()
    assert lines[next(i for i, line in enumerate(lines) if "torch.save(" in line) - 1].strip() == "model.synchronize()"
    original, asynchronous = saved(source, "original"), saved(migrated, "async")
    assert torch.equal(original["model"]["weight"], asynchronous["model"]["weight"])
    momentum = [s["momentum_buffer"] for s in original["optimizer"]["state"].values()]
    assert all(
        torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, asynchronous["optimizer"]["state"].values())
    )


STATE = """import dataclasses

import torch


@dataclasses.dataclass
class TrainState:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler


def train(state, batches):
    for x in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = state.model(x).float().sum()
        state.optimizer.zero_grad()
        state.scaler.scale(loss).backward()
        state.scaler.step(state.optimizer)
        state.scaler.update()
        print("step", repr(loss.item()))


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TrainState(model, optimizer, torch.amp.GradScaler("cpu"))
    train(state, [torch.ones(2, 4)] * 3)
    raw = state.model
    print("w", repr(float(raw.weight.detach().sum())))


main()
"""

ALIASES_BOUND_AFTER_TRAINING = {
    "of the model after its loop": LOOP.replace(
        "        READS\n", '        pass\n    raw = model\n    print("w", repr(float(raw.weight.detach().sum())))\n'
    ),
    "of a state object's model after the training call": STATE,
}


@pytest.mark.parametrize("source", ALIASES_BOUND_AFTER_TRAINING.values(), ids=ALIASES_BOUND_AFTER_TRAINING.keys())
def test_a_read_through_an_alias_bound_after_training_waits_for_the_last_step(source, slow_step, tmp_path):
    migrated = _migrated(source)
    lines = migrated.splitlines()
    read = next(i for i, line in enumerate(lines) if line.startswith('    print("w"'))
    assert "synchronize()" in lines[read - 1] or "synchronize()" in lines[read - 2]
    original = run_script(source, tmp_path, "original.py").splitlines()
    asynchronous = run_script(migrated, tmp_path, "async.py").splitlines()
    assert len(asynchronous) == len(original) and asynchronous[-1] == original[-1]
