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

import shutil

import pytest

from migrate.engine import migrate_source
from script_runs import run_script
from test_migrate_projects import PROJECTS_ROOT, migrate_project

PROJECT = PROJECTS_ROOT / "openclip_schedule_closure"

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


def _project_with_the_schedule_as(tmp_path, parameter: str, after_update: bool):
    """tests/migrate_projects/openclip_schedule_closure copied to ``tmp_path``, its schedule
    closure (built in main.py with the optimizer) handed to train.py's ``train_one_epoch``
    as ``parameter``, and called there at the top of each iteration, or (``after_update``)
    after ``scaler.update()``."""
    folder = tmp_path / "project"
    shutil.copytree(PROJECT, folder, ignore=shutil.ignore_patterns("__pycache__"))
    train = folder / "train.py"
    text = train.read_text().replace(", scheduler, args)", f", {parameter}, args)")
    text = text.replace("scheduler(step)", f"{parameter}(step)")
    if after_update:
        text = text.replace(f"        if not args.skip_scheduler:\n            {parameter}(step)\n", "")
        text = text.replace("        scaler.update()\n", f"        scaler.update()\n        {parameter}(step + 1)\n")
    assert text.count(f"{parameter}(step") == 1
    train.write_text(text)
    return folder


@pytest.mark.parametrize("parameter", ["scheduler", "lr_fn"])
@pytest.mark.parametrize("after_update", [False, True])
def test_a_schedule_handed_to_another_file_waits_and_its_migration_is_left_alone(parameter, after_update, tmp_path):
    """The closure reaches the loop of another file under any parameter name (``lr_fn``):
    beside the optimizer it may write the groups' lr, so it waits for the running step
    (``model.synchronize()`` before it); the loss function handed in beside it feeds the
    backward and does not wait. Run again on its migrated output, in either form,
    the tool changes and reports nothing (RoundPipe's autograd form keeps
    ``scaler.scale(loss).backward()`` with a scaler built in main.py)."""
    folder = _project_with_the_schedule_as(tmp_path, parameter, after_update)
    for exact in (False, True):
        migrated = migrate_project(folder, tmp_path / f"out{exact}", exact=exact)
        assert migrated.exit_code == 0 and sorted(migrated.changed) == ["main.py", "train.py"], migrated.codes
        shutil.copy(folder / "precision.py", tmp_path / f"out{exact}")
        train = migrated.changed["train.py"].decode()
        waits = "model.synchronize()\n" + " " * (12 - 4 * after_update) + f"{parameter}(step"
        assert (waits in train) is not exact, train
        assert train.count("model.synchronize()") == (0 if exact else 1), train  # not before `loss(**model_out)`
        again = migrate_project(tmp_path / f"out{exact}", tmp_path / f"again{exact}", exact=exact)
        assert (again.exit_code, again.changed, again.codes) == (0, {}, [])


def test_another_modules_group_beside_followed_groups_is_refused():
    """``AdamW(groups + [{"params": criterion.parameters()}])``: the followed ``groups`` hold
    the model's parameters, the call another module's; one optimizer over two models is
    refused (RPM108), not migrated with ``criterion`` taken for the model."""
    grouped = (
        "    criterion = torch.nn.Linear(2, 2)\n"
        '    groups = [{"params": gain_or_bias_params, "weight_decay": 0.0},\n'
        '              {"params": rest_params, "weight_decay": 0.2}]\n'
        '    optimizer = torch.optim.AdamW(groups + [{"params": criterion.parameters()}], lr=0.02)\n'
    )
    source = SCRIPT.replace("CALL", "scheduler").replace(_OPTIMIZER, grouped)
    assert "criterion.parameters()}], lr=0.02)" in source
    result = migrate_source(source, "train.py", exact=True)
    assert result.status != "migrated"
    blockers = [d.code for d in result.diagnostics if "several models (criterion and model)" in d.message]
    assert blockers == ["RPM108"], [d.format() for d in result.diagnostics]
