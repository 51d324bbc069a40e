"""The wrapped model used as a container of its layers, or through a method that reads no
weight, after the RoundPipe wrap (migrate/wrapped_containers.py, migrate/weight_free_methods.py).

``model[-1].weight``, ``len(model)``, ``for layer in model`` and ``model.parse_batch(batch)``
were refused (RPM142, RPM147); they now go to the wrapped module and print the original's
numbers under ``--exact`` (the default form runs as many steps). What would change the
program stays refused, with the blocker named: a layer run where the model is trained
(RPM147), a layer reached inside the step function (RPM142), a method that reads the model.
"""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

PROGRAM = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))

    def parse_batch(self, batch):
        x, y = batch
        return x * 2.0, y

    @staticmethod
    def targets(y):
        return y * 0.5

    def weight_sum(self):
        return self[-1].weight.sum()


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    print(f"layers {len(model)} linear {sum(isinstance(m, nn.Linear) for m in model)}")
    for step in range(5):
        batch = (torch.randn(20, 8, generator=gen), torch.randn(20, 1, generator=gen))
        x, y = model.parse_batch(batch)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x)
        loss = F.mse_loss(pred.float(), model.targets(y))
        scaler.scale(loss).backward()
        #STEP#
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item()!r} last {model[-1].weight.sum().item()!r}")
    #AFTER#
    print(f"first {model[0].bias.sum().item()!r} relu {nn.ReLU() in model}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
"""


def _program(after: str = "", template: str = PROGRAM) -> str:
    return template.replace("        #STEP#\n", "").replace("    #AFTER#\n", after)


@pytest.mark.parametrize(
    "after",
    ["", "    for layer in model:\n        print(type(layer).__name__)\n"],
    ids=["reads", "loop-over-layers"],
)
def test_layers_and_weight_free_methods_go_to_the_wrapped_module(after, tmp_path):
    source = _program(after=after)
    exact = migrate_source(source, "train.py", exact=True)
    default = migrate_source(source, "train.py")
    for result in (exact, default):
        assert result.status == "migrated", [d.format() for d in result.diagnostics]
        assert "x, y = model.model.parse_batch(batch)" in result.migrated
        assert "F.mse_loss(pred.float(), model.targets(y))" in result.migrated  # moved: forwarded as before
        assert "len(model.model)" in result.migrated and "for m in model.model)" in result.migrated
        assert "model.model[-1].weight" in result.migrated and "in model.model}" in result.migrated
        again = migrate_source(result.migrated, "train.py", exact=result is exact)
        assert again.migrated == result.migrated and not again.diagnostics
    text = default.migrated  # the last asynchronous step is waited for before the layers are read after training
    assert text.index("model.step(_step_fn)") < text.index("\n    model.synchronize()\n") < text.index("first {")
    original = run_script(source, tmp_path, "original.py")
    assert original.count("step ") == 5
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == 5


@pytest.mark.parametrize(
    ("change", "code", "text"),
    [
        (  # a layer run where the model is trained, with gradients
            (
                "        loss = F.mse_loss(pred.float(), model.targets(y))\n",
                "        loss = F.mse_loss(model[2](model[1](model[0](x))), y)\n",
            ),
            "RPM147",
            "may run outside RoundPipe",
        ),
        (  # the layers reached in the step function hold the model's weights, not the copies
            (
                "        #STEP#\n",
                "        scaler.unscale_(optimizer)\n"
                "        torch.nn.utils.clip_grad_norm_(model[0].parameters(), 1.0)\n",
            ),
            "RPM142",
            "in its step function",
        ),
        (  # a method of the model that reads its weights
            ("model.targets(y)", "model.weight_sum() * y"),
            "RPM147",
            "reaches the module",
        ),
        (  # a statement moved into the loss function is rebuilt from its original text
            ("model.targets(y)", "y + 0.0 * model[0].bias.sum()"),
            "RPM142",
            "moves into the loss or step function",
        ),
    ],
    ids=["layer-run-with-gradients", "layer-in-step-function", "method-reading-weights", "layer-in-loss"],
)
def test_uses_that_would_change_the_program_are_refused(change, code, text):
    source = _program(template=PROGRAM.replace(*change))
    assert source != _program()
    result = migrate_source(source, "train.py", exact=True)
    assert result.migrated == source
    assert [d.code for d in result.diagnostics] == [code], [d.format() for d in result.diagnostics]
    assert text in result.diagnostics[0].message


REBOUND = """
import torch
import torch.nn as nn


def set_requires_grad(nets, flag):
    if not isinstance(nets, list):
        nets = [nets]
    for net in nets:
        for param in net.parameters():
            param.requires_grad = flag


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    gen = torch.Generator().manual_seed(1)
    for step in range(4):
        x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 1, generator=gen)
        set_requires_grad(model, True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (model(x).float() - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")


if __name__ == "__main__":
    main()
"""


def test_a_parameter_rebound_in_the_function_it_is_handed_to_is_not_taken_for_the_container(tmp_path):
    """``nets = [nets]`` (CycleGAN's ``set_requires_grad``): ``for net in nets`` iterates the
    list, so it must not become ``nets.model``."""
    exact = migrate_source(REBOUND, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert "    for net in nets:\n" in exact.migrated
    original = run_script(REBOUND, tmp_path, "original.py")
    assert original.count("step ") == 4
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
