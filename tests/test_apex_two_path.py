"""The apex two-path split (migrate/apex_two_path.py): ``amp.scale_loss`` or a plain
``loss.backward()`` in an ``if``, one optimizer step shared after it. Each program runs as
written on tests/fake_apex and as ``roundpipe-migrate --exact`` output on roundpipe.compat,
with fp16 on (O1 and O2) and off (O0: the stand-in ignores ``enabled=``): the printed
numbers are identical; the default migration runs the same steps.

Batch 2's targets are 1e34 times larger and the loss is multiplied by their size: with fp16
on, its scaled gradients overflow, the step is skipped, the scale halves and the clipped norm
is NaN (``is_overflow``), so that iteration is not logged.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from migrate.engine import migrate_source
from test_migrate_projects import run_program

PROGRAM = """import math

import torch
from apex import amp


def criterion(out, y):
    size = y.abs().max()
    return torch.nn.functional.mse_loss(out, y / size) * size


def main(fp16):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, opt_level="LEVEL", verbosity=0)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 8, generator=generator), torch.randn(16, 2, generator=generator)) for _ in range(6)]
    data[2] = (data[2][0], data[2][1] * 1e34)
    is_overflow = False
    for i, (x, y) in enumerate(data):
        model.zero_grad()
        loss = criterion(model(x), y)
        reduced_loss = loss.item()
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
CLIP
        optimizer.step()
        if not is_overflow:
            weight = next(model.parameters()).float().sum().item()
            print(f"step {i} loss {reduced_loss!r} grad_norm {float(grad_norm)!r} weight {weight!r}")
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale'] if fp16 else 1.0}")


if __name__ == "__main__":
    main(FP16)
"""

#: the optimizer work after the `if`: a clip per path (the AMP one on the master params,
#: with the overflow test), or one clip for both
CLIPS = {
    "clip-per-path": """        if fp16:
            grad_norm = torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
            is_overflow = math.isnan(grad_norm)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
""",
    "one-clip": "        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n",
}

STEP = re.compile(r"^step (\d+) ", re.M)


def _run(source: str, folder: pathlib.Path) -> str:
    folder.mkdir()
    (folder / "main.py").write_text(source)
    return run_program(folder)


#: (clip, fp16, level); one clip on ``model.parameters()`` under O2 measures apex's scaled
#: float16 model gradients (NVIDIA's scripts clip the master params there), left out
CASES = [
    (clip, fp16, level)
    for clip in sorted(CLIPS)
    for fp16, level in (("True", "O1"), ("True", "O2"), ("False", "O0"))
    if (clip, level) != ("one-clip", "O2")
]

_INITIALIZE = "    model, optimizer = amp.initialize("


@pytest.mark.parametrize("clip, fp16, level", CASES)
def test_both_paths_print_apexs_numbers_and_the_default_runs_the_same_steps(clip, fp16, level, tmp_path):
    source = PROGRAM.replace("LEVEL", level).replace("CLIP\n", CLIPS[clip]).replace("FP16", fp16)
    _check_migrations(source, clip, fp16, tmp_path)


@pytest.mark.parametrize("fp16", ["True", "False"])
def test_apex_set_up_for_fp16_runs_only_gets_a_disabled_set_up_for_the_plain_path(fp16, tmp_path):
    """Tacotron2's ``if hparams.fp16_run: model, optimizer = amp.initialize(...)``: the
    plain path is the untouched fp32 program."""
    source = PROGRAM.replace("LEVEL", "O1").replace("CLIP\n", CLIPS["clip-per-path"]).replace("FP16", fp16)
    source = source.replace(_INITIALIZE, "    if fp16:\n    " + _INITIALIZE)
    migrated = _check_migrations(source, "clip-per-path", fp16, tmp_path)
    assert "    else:\n        model, optimizer = roundpipe.compat.initialize(model, optimizer, enabled=False)\n" in (
        migrated
    )


def test_apex_set_up_under_another_condition_is_refused():
    source = PROGRAM.replace("LEVEL", "O1").replace("CLIP\n", CLIPS["one-clip"]).replace("FP16", "True")
    source = source.replace(_INITIALIZE, "    if torch.cuda.is_available():\n    " + _INITIALIZE)
    result = migrate_source(source, "main.py", exact=True)
    assert [d.code for d in result.diagnostics] == ["RPM136"]
    assert "the plain path would step a model RoundPipe never wrapped" in result.diagnostics[0].message
    assert result.migrated == source


def _check_migrations(source: str, clip: str, fp16: str, tmp_path: pathlib.Path) -> str:
    """Run ``source`` and its migrations; return the exact one."""
    exact = migrate_source(source, "main.py", exact=True)
    assert not exact.diagnostics, [(d.code, d.message) for d in exact.diagnostics]
    assert "            with model.scale_loss(loss, amp_scaler) as scaled_loss:\n" in exact.migrated
    assert "        else:\n            loss.backward()\n" in exact.migrated
    assert "        model.step(_step_fn, is_async=False)\n        amp_scaler.update()\n" in exact.migrated
    assert "apex" not in exact.migrated
    original = _run(source, tmp_path / "original")
    if fp16 == "True" and clip == "clip-per-path":
        assert "step 2 " not in original  # the overflow step is not logged
    assert _run(exact.migrated, tmp_path / "exact") == original
    default = migrate_source(source, "main.py", exact=False)
    assert not default.diagnostics, [(d.code, d.message) for d in default.diagnostics]
    assert STEP.findall(_run(default.migrated, tmp_path / "default")) == STEP.findall(original)
    return exact.migrated
