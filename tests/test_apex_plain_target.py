"""``--apex-target plain``: apex scripts written with upstream RoundPipe's API (issue 15).

A small apex program (a BatchNorm regressor, clipping on ``amp.master_params``, an eval
forward, an evaluation loss and a matmul outside the model (which apex's O1 casts too), one
batch whose float16 gradients overflow at the dynamic scale) runs as written on
tests/fake_apex (whose O1 is CPU autocast in bfloat16, as compat's on the CPU), as the compat
migration and as the plain migration, for O0 to O3 and their literal overrides; with
``--exact`` all three print the same numbers (the fake apex lacks apex's O2 state dict hook, which both
migrations have: their state dicts agree with each other), in the default form the two migrations print the same (each
forward one step stale). The plain output needs nothing upstream lacks. Settings the plain
target cannot follow keep the compat form, byte for byte, with RPM303 naming the cause.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import runpy
import sys
from typing import List

import pytest
import torch

from migrate.engine import migrate_source
from migrate_cli_support import run
from o1_casts import end_o1_casts
from upstream_api import check_program

FAKE_APEX = pathlib.Path(__file__).parent / "fake_apex"

SCRIPT = """
import torch
import torch.nn as nn
from apex import amp


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 3))
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = amp.initialize(model, optimizer, verbosity=0, SETTINGS)
    generator = torch.Generator().manual_seed(1)
    data = [(torch.randn(12, 6, generator=generator), torch.randn(12, 3, generator=generator)) for _ in range(6)]
    data[OVERFLOW] = (data[OVERFLOW][0], data[OVERFLOW][1] * 3000.0)
    probe = torch.randn(4, 6, generator=generator)
    model.train()
    for step, (inputs, targets) in enumerate(data):
        optimizer.zero_grad()
        loss = criterion(model(inputs), targets)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
        optimizer.step()
        print(f"step {step} loss {loss.item():.10f}")
    model.eval()
    with torch.no_grad():
        output = model(probe)
        eval_loss = torch.nn.functional.cross_entropy(output, torch.tensor([0, 1, 2, 0]))
        similarity = probe @ probe.T
    print(f"eval {output.dtype} {output.double().sum().item():.10f}")
    print(f"outside the model {eval_loss.dtype} {eval_loss.item():.10f}", similarity.dtype, similarity.sum().item())
    print(sorted({str(value.dtype) for value in model.state_dict().values()}))


if __name__ == "__main__":
    main()
"""

# settings, the batch that overflows (-1: none; O3 and static scales are not checked in apex)
PLAIN = {
    "O0": ('opt_level="O0"', 3),
    "O0-dynamic": ('opt_level="O0", loss_scale="dynamic"', 3),
    "O1": ('opt_level="O1"', 3),
    "O1-implicit": ("patch_torch_functions=True, keep_batchnorm_fp32=None, master_weights=None", 3),
    "O1-static": ('opt_level="O1", loss_scale=128.0', -1),
    "O1-scale-one": ('opt_level="O1", loss_scale=1.0', -1),
    "O2": ('opt_level="O2"', 3),
    "O2-half-batchnorm": ('opt_level="O2", keep_batchnorm_fp32=False', 3),
    "O2-static": ('opt_level="O2", loss_scale=128.0', -1),
    "O3": ('opt_level="O3"', -1),
    "O3-fp32-batchnorm": ('opt_level="O3", keep_batchnorm_fp32=True', -1),
}

# settings -> the cause RPM303 names
COMPAT = {
    "O1-batchnorm": ('opt_level="O1", keep_batchnorm_fp32=True', "keep_batchnorm_fp32=True) under O1 raises"),
    "O1-masters": ('opt_level="O1", master_weights=False', "master_weights=False) under O1 raises"),
    "O1-outputs": ('opt_level="O1", cast_model_outputs=torch.float16', "cast_model_outputs=torch.float16"),
    "no-patches": ('opt_level="O1", patch_torch_functions=False', "patch_torch_functions=False"),
    "run-time": ("opt_level=LEVEL", "known only at run time"),
    "min-scale": ('opt_level="O2", min_loss_scale=1.0', "min_loss_scale=1.0"),
    "max-scale": ('opt_level="O2", max_loss_scale=2.0**20', "max_loss_scale=2.0**20"),
    "fp16-copies": ('opt_level="O2", master_weights=False', "refuses to unscale float16"),
    "odd-static": ('opt_level="O2", loss_scale=100.1', "not a power of two"),
    "num-losses": ('opt_level="O2", num_losses=2', "num_losses=2"),
}


def _script(settings: str, overflow: int) -> str:
    source = SCRIPT if overflow >= 0 else "\n".join(line for line in SCRIPT.split("\n") if "OVERFLOW" not in line)
    return source.replace("SETTINGS", settings).replace("OVERFLOW", str(overflow))


def _printed(source: str, path: pathlib.Path) -> List[str]:
    path.write_text(source)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        runpy.run_path(str(path), run_name="__main__")
    end_o1_casts()
    return out.getvalue().splitlines()


@pytest.fixture
def fake_apex(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKE_APEX))
    for name in [name for name in sys.modules if name == "apex" or name.startswith("apex.")]:
        monkeypatch.delitem(sys.modules, name)


def _migrated(source: str, exact: bool, target: str) -> str:
    result = migrate_source(source, "script.py", exact=exact, apex_target=target)
    assert result.status == "migrated" and not result.diagnostics, result.diagnostics
    return result.migrated


# The script's model stays on the CPU. With CUDA present the plain O1 form autocasts for
# CUDA, compat and the fake apex for the CPU (docs/apex.md, "O1's casts"): run O1 on CPU hosts.
CPU_O1 = pytest.mark.skipif(torch.cuda.is_available(), reason="O1's plain autocast is CUDA's where CUDA is present")


def _marks(case: str) -> List[pytest.MarkDecorator]:
    return ([] if case in ("O0", "O1", "O2") else [pytest.mark.slow]) + ([CPU_O1] if case.startswith("O1") else [])


@pytest.mark.parametrize("case", [pytest.param(case, marks=_marks(case)) for case in PLAIN])
def test_exact_plain_migration_prints_apexs_numbers(case: str, fake_apex, tmp_path) -> None:
    source = _script(*PLAIN[case])
    plain = _migrated(source, exact=True, target="plain")
    assert "roundpipe.compat" not in plain and "from apex" not in plain and " amp.scale_loss" not in plain
    original = _printed(source, tmp_path / "original.py")
    compat = _printed(_migrated(source, exact=True, target="compat"), tmp_path / "compat.py")
    assert _printed(plain, tmp_path / "plain.py") == compat
    # the last line, the state dict's dtypes: the fake apex has no O2 state dict hook
    assert compat[:-1] == original[:-1]
    assert len({line.split()[-1] for line in original if line.startswith("step")}) > 1


@pytest.mark.parametrize(
    "case", [pytest.param("O1", marks=CPU_O1), "O2", pytest.param("O2-static", marks=pytest.mark.slow), "O3"]
)
def test_default_plain_migration_prints_the_compat_migrations_numbers(case: str, tmp_path) -> None:
    source = _script(*PLAIN[case])
    plain = _printed(_migrated(source, exact=False, target="plain"), tmp_path / "plain.py")
    assert plain == _printed(_migrated(source, exact=False, target="compat"), tmp_path / "compat.py")
    assert sum(line.startswith("step") for line in plain) == 6


@pytest.mark.parametrize("case", list(PLAIN))
def test_plain_migration_uses_only_upstream_api(case: str) -> None:
    for exact in (False, True):
        report = check_program(_migrated(_script(*PLAIN[case]), exact=exact, target="plain"))
        assert not report.violations, "\n".join(map(str, report.violations))
        assert not report.compat_names


def test_o1_plain_migration_wraps_the_model_in_an_autocasting_roundpipe() -> None:
    plain = _migrated(_script(*PLAIN["O1"]), exact=False, target="plain")
    assert "_apex_cast_model" not in plain  # O1 keeps the model float32 and its inputs as they are
    assert (
        "    criterion = nn.MSELoss()\n"
        "    model = _ApexAutocastRoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig("
        "num_microbatch=NUM_MICROBATCH))\n"
        "    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)\n"
        "    _apex_o1_casts()\n"  # where amp.initialize was: apex's casts from here on
        "    generator = "
    ) in plain
    assert "class _ApexAutocastRoundPipe(roundpipe.RoundPipe):" in plain
    assert '    return "cpu", torch.bfloat16\n' in plain
    assert "    amp_scaler = roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)\n" in plain
    # the checker follows the subclass as a RoundPipe: a keyword upstream lacks is reported
    broken = plain.replace("loss_fn=_loss_fn)", "loss_fn=_loss_fn, chunks=2)")
    assert [v.key for v in check_program(broken).violations] == ["roundpipe.RoundPipe.forward_backward(chunks=)"]
    again = migrate_source(plain, "script.py", apex_target="plain")
    assert again.migrated == plain and not again.diagnostics and not again.rewrites  # idempotent


@CPU_O1
def test_o1_plain_migration_casts_outside_the_model_as_apex(fake_apex, tmp_path) -> None:
    """apex's O1 patches torch for the whole program: the evaluation loss and the matmul the
    script computes outside the model are cast there (float32 and bfloat16 on the fake apex),
    and so they are after the plain migration's ``_apex_o1_casts()``; without it they differ."""
    source = _script(*PLAIN["O1"])
    plain = _migrated(source, exact=True, target="plain")
    original = _printed(source, tmp_path / "original.py")
    assert original[-2].startswith("outside the model torch.float32 ") and " torch.bfloat16 " in original[-2]
    assert _printed(plain, tmp_path / "plain.py")[-2] == original[-2]
    uncast = plain.replace("    _apex_o1_casts()\n", "")
    assert _printed(uncast, tmp_path / "uncast.py")[-2] != original[-2]


@CPU_O1
def test_o1_plain_step_functions_run_with_autocast_off(tmp_path) -> None:
    """apex runs the optimizer step with its casts off: the subclass's ``step`` runs the step
    function without autocast where it runs on the calling thread (``--exact``)."""
    plain = _migrated(_script(*PLAIN["O1"]), exact=True, target="plain")
    probe = plain.replace(
        "            amp_scaler.step(optimizer)\n",
        "            amp_scaler.step(optimizer)\n"
        "            print('autocast in step', torch.is_autocast_enabled('cpu'))\n",
    )
    printed = _printed(probe, tmp_path / "probe.py")
    assert printed.count("autocast in step False") == 6


def test_plain_migration_casts_the_model_where_the_optimizer_is_built() -> None:
    plain = _migrated(_script(*PLAIN["O2"]), exact=False, target="plain")
    assert (
        "    criterion = nn.MSELoss()\n"
        "    _apex_cast_model(model, torch.float16, keep_batchnorm_fp32=True)\n"
        "    model = roundpipe.RoundPipe(\n"
        "        model,\n"
        "        optim_dtype=torch.float32,\n"
        "        model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH),\n"
        "    )\n"
        "    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)\n"
        "    generator = "
    ) in plain
    assert "    amp_scaler = roundpipe.GradScaler(init_scale=2.0**16, growth_interval=2000)\n" in plain
    assert plain.index("def _apex_cast(") < plain.index("def main():")
    again = migrate_source(plain, "script.py", apex_target="plain")
    assert again.migrated == plain and not again.diagnostics and not again.rewrites  # idempotent


@pytest.mark.parametrize("case", list(COMPAT))
def test_settings_plain_code_cannot_follow_keep_the_compat_form(case: str) -> None:
    settings, cause = COMPAT[case]
    source = _script(settings, 3)
    if case == "run-time":
        source = source.replace("def main():", 'LEVEL = "O2"\n\n\ndef main():')
    compat = migrate_source(source, "script.py", apex_target="compat")
    kept = migrate_source(source, "script.py", apex_target="plain")
    assert kept.migrated == compat.migrated and "roundpipe.compat.initialize" in kept.migrated
    notes = [d for d in kept.diagnostics if d.code == "RPM303"]
    assert len(notes) == 1 and cause in notes[0].message, kept.diagnostics
    assert notes[0].line == source[: source.index("amp.initialize")].count("\n") + 1
    assert kept.diagnostics == compat.diagnostics + notes


_INITIALIZE = "model, optimizer = amp.initialize(model, optimizer, verbosity=0,"

# amp.initialize shapes beyond one model and one optimizer variable: the plain target writes
# nothing of its own (the output is compat's); the code the file gets
SHAPES = {
    "positional-enabled": ("model, optimizer = amp.initialize(model, optimizer, True, verbosity=0,", "RPM303"),
    "lists": ("[model], [optimizer] = amp.initialize([model], [optimizer], verbosity=0,", "RPM125"),
    "two-models": ("(model, other), optimizer = amp.initialize([model, other], optimizer, verbosity=0,", "RPM125"),
}


@pytest.mark.parametrize("case", list(SHAPES))
def test_initialize_shapes_plain_code_cannot_follow_get_the_compat_output(case: str) -> None:
    """A shape the plain target cannot follow comes out as the compat migration does (a note
    where compat migrates it, compat's own refusal where compat refuses it)."""
    line, expected = SHAPES[case]
    source = _script('opt_level="O2"', 3).replace(_INITIALIZE, line)
    source = source.replace(
        "    criterion = nn.MSELoss()\n", "    criterion = nn.MSELoss()\n    other = nn.Linear(2, 2)\n"
    )
    compat = migrate_source(source, "script.py", apex_target="compat")
    kept = migrate_source(source, "script.py", apex_target="plain")
    assert kept.migrated == compat.migrated and "_apex_cast_model" not in kept.migrated
    assert expected in [d.code for d in kept.diagnostics], kept.diagnostics


ACCUMULATING = """
import torch
from apex import amp


def main():
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", verbosity=0)
    optimizer.zero_grad()
    for i in range(8):
        loss = model(torch.randn(4, 8)).pow(2).mean() / 2
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        if (i + 1) % 2 == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_gradient_accumulation_keeps_the_compat_form() -> None:
    kept = migrate_source(ACCUMULATING, "script.py", apex_target="plain")
    assert kept.migrated == migrate_source(ACCUMULATING, "script.py").migrated != ACCUMULATING
    assert [d.code for d in kept.diagnostics] == ["RPM303"] and "accumulation" in kept.diagnostics[0].message
    assert kept.diagnostics[0].line == 13  # the scale_loss block


def test_loss_scaler_state_keeps_the_compat_form() -> None:
    source = _script(*PLAIN["O2"]).replace("    model.eval()\n", "    saved = amp.state_dict()\n    model.eval()\n")
    kept = migrate_source(source, "script.py", apex_target="plain")
    assert "roundpipe.compat.state_dict()" in kept.migrated
    assert [d.code for d in kept.diagnostics] == ["RPM303"] and "amp.state_dict" in kept.diagnostics[0].message


def test_o1_function_casting_keeps_the_compat_form() -> None:
    source = _script(*PLAIN["O1"]).replace(
        "    optimizer = torch.optim", '    amp.register_float_function(torch, "sigmoid")\n    optimizer = torch.optim'
    )
    kept = migrate_source(source, "script.py", apex_target="plain")
    assert "roundpipe.compat.register_float_function(torch" in kept.migrated
    assert "roundpipe.compat.initialize(" in kept.migrated and "_ApexAutocastRoundPipe" not in kept.migrated
    notes = [d for d in kept.diagnostics if d.code == "RPM303"]
    assert len(notes) == 1 and "amp.register_float_function" in notes[0].message, kept.diagnostics


def test_generated_helpers_capture_no_user_name() -> None:
    source = _script(*PLAIN["O2"]).replace("def main():", "def _apex_cast(value):\n    return value\n\n\ndef main():")
    plain = _migrated(source, exact=False, target="plain")
    assert "def _apex_cast(value):\n    return value\n" in plain and "def _apex_cast_2(value, dtype):" in plain
    assert "_apex_cast(args, dtype)" not in plain and "_apex_cast_2(args, dtype)" in plain


def test_command_line_flag_chooses_the_target(tmp_path, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text(_script(*PLAIN["O2"]))
    (tmp_path / "other.py").write_text(_script(*COMPAT["min-scale"][:1], 3))  # two files: the project pass too
    code, out, err = run(capsys, tmp_path, "--apex-target", "plain")
    assert code == 0 and "RPM303" in err and "other.py" in err
    code, out, err = run(capsys, script, "--apex-target", "plain")
    assert code == 0 and "+    _apex_cast_model(model, torch.float16" in out and "roundpipe.compat" not in out
    code, out, err = run(capsys, script)
    assert code == 0 and "+    model, optimizer = roundpipe.compat.initialize(" in out
    code, out, err = run(capsys, script, "--apex-target", "upstream")
    assert code == 2 and "--apex-target" in err
