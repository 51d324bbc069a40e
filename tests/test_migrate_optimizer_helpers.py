"""Optimizers built from parameter groups (issue 10, shape 8), in the spellings real trainers
use: groups built inline from ``named_parameters()`` (transformers' examples), by a helper
into a variable (torchvision's ``set_weight_decay``), or by a helper that builds the
optimizer (timm's ``create_optimizer``). The ``--exact`` migration prints the original's
numbers; the default one runs as many steps."""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import torch
import torch.nn.functional as F


def set_weight_decay(model, weight_decay):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith("bias") or name.startswith("1.") else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def create_optimizer(model, lr):
    return torch.optim.AdamW(set_weight_decay(model, 0.1), lr=lr)


def train(kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    if kind == "inline":
        optimizer = torch.optim.AdamW(
            [
                {"params": [p for n, p in model.named_parameters() if not n.startswith("1.")], "weight_decay": 0.1},
                {"params": [p for n, p in model.named_parameters() if n.startswith("1.")], "weight_decay": 0.0},
            ],
            lr=0.01,
        )
    elif kind == "variable":
        parameters = set_weight_decay(model, 0.05)
        optimizer = torch.optim.SGD(parameters, lr=0.05, momentum=0.9)
    else:
        optimizer = create_optimizer(model, 0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    gen = torch.Generator().manual_seed(9)
    for step in range(5):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")


train(KIND)
"""


@pytest.mark.parametrize("kind", ["inline", "variable", "helper"])
def test_parameter_groups_train_the_same_after_migration(kind, tmp_path):
    source = SCRIPT.replace("KIND", repr(kind))
    original = run_script(source, tmp_path, "original.py")
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert exact.migrated.count(".adopt_optimizer(") == 3
    assert "model.model.named_parameters()" in exact.migrated  # the inline groups see the module's names
    assert run_script(exact.migrated, tmp_path, "exact.py") == original
    default = migrate_source(source, "train.py")
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == original.count("step ") == 5


def test_a_builtin_constant_passed_to_the_optimizer_is_no_group_variable(tmp_path):
    """``AdamW([...groups...], lr=..., amsgrad=True)``: ``True`` is a name bound nowhere in
    the file (libcst answers a builtin for it, with no node); it is not followed as a groups
    variable, and the migration prints the original's numbers (it crashed with RPM904 before)."""
    source = SCRIPT.replace("KIND", repr("inline")).replace(
        "lr=0.01,\n        )", "lr=0.01,\n            amsgrad=True,\n        )"
    )
    assert "amsgrad=True" in source
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert run_script(exact.migrated, tmp_path, "exact.py") == run_script(source, tmp_path, "original.py")
