"""OpenCLIP's optimizer and schedule (held-out round 2, tests/migrate_projects/
openclip_schedule_closure).

The parameters are grouped through earlier assignments (``named = list(model.
named_parameters())``, then two filtered lists, then ``AdamW([{"params": ...}, ...])``): the
optimizer is adopted onto RoundPipe's copies and the ``--exact`` migration prints the
original's numbers. The schedule is a closure built by ``cosine_lr(optimizer, ...)`` and
called as ``scheduler(step)`` at the top of each iteration, writing every group's lr: in the
default (asynchronous) form it must wait for the running step (``model.synchronize()``
before it), or it races with the optimizer thread.
"""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

SCRIPT = """
import math

import torch
import torch.nn.functional as F


def assign_learning_rate(optimizer, new_lr):
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lr


def cosine_lr(optimizer, base_lr, steps):
    def _lr_adjuster(step):
        lr = 0.5 * (1 + math.cos(math.pi * step / steps)) * base_lr
        assign_learning_rate(optimizer, lr)
        return lr

    return _lr_adjuster


def log_progress(step):
    return step


def main():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
    exclude = lambda n, p: p.ndim < 2 or "bias" in n
    named_parameters = list(model.named_parameters())
    gain_or_bias_params = [p for n, p in named_parameters if exclude(n, p) and p.requires_grad]
    rest_params = [p for n, p in named_parameters if not exclude(n, p) and p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": gain_or_bias_params, "weight_decay": 0.0}, {"params": rest_params, "weight_decay": 0.2}],
        lr=0.02,
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    scheduler = cosine_lr(optimizer, 0.02, 6)
    gen = torch.Generator().manual_seed(9)
    for step in range(6):
        CALL(step)
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item()!r} lr {optimizer.param_groups[1]['lr']!r}")


main()
"""


def test_groups_built_through_earlier_assignments_train_the_same(tmp_path):
    source = SCRIPT.replace("CALL", "scheduler")
    exact = migrate_source(source, "train.py", exact=True)
    assert exact.status == "migrated", [d.format() for d in exact.diagnostics]
    assert "optimizer = model.adopt_optimizer(torch.optim.AdamW(" in exact.migrated
    assert run_script(exact.migrated, tmp_path, "exact.py") == run_script(source, tmp_path, "original.py")


@pytest.mark.parametrize("call, waits", [("scheduler", True), ("log_progress", False)])
def test_a_schedule_closure_called_in_the_loop_waits_for_the_step(call, waits, tmp_path):
    source = SCRIPT.replace("CALL", call)
    default = migrate_source(source, "train.py")
    assert default.status == "migrated", [d.format() for d in default.diagnostics]
    before_call = default.migrated.split(f"        {call}(step)")[0].rstrip().splitlines()[-1].strip()
    assert (before_call == "model.synchronize()") is waits
    assert run_script(default.migrated, tmp_path, "default.py").count("step ") == 6


_OPTIMIZER = """    optimizer = torch.optim.AdamW(
        [{"params": gain_or_bias_params, "weight_decay": 0.0}, {"params": rest_params, "weight_decay": 0.2}],
        lr=0.02,
    )
"""


@pytest.mark.parametrize(
    "change, blocker",
    [
        ('groups.append({"params": list(criterion.parameters()), "lr": 0.01})', "several models (criterion and model)"),
        ("rest_params.extend(criterion.parameters())", "several models (criterion and model)"),
        ("groups.append(extra)", "'groups' is changed"),
    ],
)
def test_groups_changed_before_the_optimizer_are_refused(change, blocker):
    """A group list changed after its assignment (``groups.append(...)``) may hold the
    parameters of another module (a learned loss temperature): adopting that optimizer would
    raise at run time, so it is refused statically, naming the statement."""
    grouped = (
        "    criterion = torch.nn.Linear(2, 2)\n"
        "    extra = {}\n"
        '    groups = [{"params": gain_or_bias_params, "weight_decay": 0.0},\n'
        '              {"params": rest_params, "weight_decay": 0.2}]\n'
        f"    {change}\n"
        "    optimizer = torch.optim.AdamW(groups, lr=0.02)\n"
    )
    source = SCRIPT.replace("CALL", "scheduler").replace(_OPTIMIZER, grouped)
    assert change in source and "AdamW(groups, lr=0.02)" in source
    result = migrate_source(source, "train.py", exact=True)
    assert result.status != "migrated"
    assert [d.code for d in result.diagnostics if blocker in d.message] == ["RPM108"], [
        d.format() for d in result.diagnostics
    ]
