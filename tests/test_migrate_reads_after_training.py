"""Main-thread uses of the wrapped model after the training loop (issue 10 review, S1): the
last asynchronous step may still run when the loop ends, so a forward, a weight read, a
``parameters()`` loop or a printed weight after it gets ``model.synchronize()`` first, in
the same function or in the caller of the training function. Uses inside the training loop
stay one step stale (the documented default form) and get none. Each program is run with a
slowed optimizer step, original against default migration."""

import pytest

from migrate.engine import migrate_source
from script_runs import run_script

FIT = """import torch


def fit(model, optimizer, scaler, batches):
    for x in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().sum()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print("step", repr(loss.item()))
    AFTER_IN_FIT
    return model


def main():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    model = fit(model, optimizer, scaler, [torch.ones(2, 4)] * 3)
    AFTER_IN_MAIN


main()
"""

USES = {
    "forward_in_caller": ("pass", 'print("logits", repr(float(model(torch.ones(1, 4)).detach().sum())))'),
    "parameters_in_caller": ("pass", 'print("w", repr(float(sum(p.sum() for p in model.parameters()))))'),
    "weight_printed_in_caller": ("pass", 'print("w", repr(float(model.weight.sum())))'),
    "parameters_after_loop": ('print("w", repr(float(sum(p.sum() for p in model.parameters()))))', "pass"),
    "forward_after_loop": ('print("logits", repr(float(model(torch.ones(1, 4)).detach().sum())))', "pass"),
}


def _program(use: str) -> str:
    in_fit, in_main = USES[use]
    return FIT.replace("AFTER_IN_FIT", in_fit).replace("AFTER_IN_MAIN", in_main)


def _migrated(source: str) -> str:
    result = migrate_source(source, "train.py")
    assert result.status == "migrated", [d.format() for d in result.diagnostics]
    return result.migrated


def _line_before(source: str, line: str) -> str:
    lines = source.splitlines()
    return lines[lines.index(line) - 1].strip()


@pytest.mark.parametrize("use", list(USES))
def test_a_use_after_the_training_loop_sees_the_last_steps_weights(use, slow_step, tmp_path):
    source = _program(use)
    migrated = _migrated(source)
    line = next(u for u in USES[use] if u != "pass")
    indent = "    "
    assert _line_before(migrated, indent + line) == "model.synchronize()"
    assert migrated.count("model.synchronize()") == 1
    original = run_script(source, tmp_path, "original.py").splitlines()
    asynchronous = run_script(migrated, tmp_path, "async.py").splitlines()
    # the loop's losses are one step stale in the default form; what follows it is not
    assert len(asynchronous) == len(original) == 4 and asynchronous[-1] == original[-1]


def test_a_weight_read_inside_the_training_loop_stays_one_step_stale():
    source = _program("forward_in_caller").replace(
        '        print("step", repr(loss.item()))',
        '        print("step", repr(loss.item()), repr(float(model.weight.sum())))',
    )
    migrated = _migrated(source)
    lines = migrated.splitlines()
    loop_end = lines.index("        model.step(_step_fn)")
    assert all("synchronize" not in line for line in lines[: loop_end + 4])
    assert migrated.count("model.synchronize()") == 1  # the forward in main only


def test_the_exact_form_gets_no_synchronize():
    result = migrate_source(_program("forward_in_caller"), "train.py", exact=True)
    assert result.status == "migrated" and "synchronize" not in result.migrated


EVALUATION_LOOP = """    for x in [torch.ones(1, 4)] * 2:
        print("logits", repr(float(model(x).detach().sum())))"""


def test_an_evaluation_loop_after_training_waits_once_before_it():
    migrated = _migrated(FIT.replace("AFTER_IN_FIT", "pass").replace("    AFTER_IN_MAIN", EVALUATION_LOOP))
    assert _line_before(migrated, EVALUATION_LOOP.splitlines()[0]) == "model.synchronize()"
    assert migrated.count("model.synchronize()") == 1
