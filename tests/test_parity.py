"""roundpipe-parity: the quick CPU matrix passes, a planted bug makes it fail, and the three
report files agree with each other and with the JSON schema."""

import json
import math
import re

import pytest
import torch

import roundpipe.grad_scaler as grad_scaler_module
from compat_matrix.cli import main
from compat_matrix.report import validate_report


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("parity")
    code = main(["--quick", "--out", str(out)])
    return code, out, json.loads((out / "report.json").read_text())


def test_quick_cpu_matrix_has_no_diverged_row(quick_report):
    code, _, data = quick_report
    assert code == 0
    assert data["summary"]["diverged"] == 0
    verdicts = {(r["scenario"], r["reference"], r["subject"]): r["verdict"] for r in data["rows"]}
    assert verdicts[("forced_overflow", "torch", "dropin")] == "bitwise"
    assert verdicts[("forced_overflow", "torch", "exact")] == "bitwise"
    assert verdicts[("forced_overflow", "async_reference", "async")] == "bitwise"
    assert verdicts[("microbatches", "torch", "exact")] == "close"
    assert verdicts[("example:amp_basic.py", "original", "migrated --exact")] == "bitwise"
    skipped = [r for r in data["rows"] if r["verdict"] == "skipped"]
    assert skipped and all(r["reason"] for r in skipped)
    if not torch.cuda.is_available():
        assert all(r["device"] == "cpu" for r in data["rows"])


def test_report_files_agree_and_follow_the_schema(quick_report):
    _, out, data = quick_report
    validate_report(data)
    assert data["environment"]["torch"] == torch.__version__
    markdown = (out / "report.md").read_text()
    table = [line for line in markdown.splitlines() if line.startswith("| ") and not line.startswith("| scenario")]
    parsed = [[cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table]
    assert [(p[0], p[1], p[2], p[3], p[5]) for p in parsed] == [
        (r["scenario"], r["reference"], r["subject"], r["device"], r["verdict"]) for r in data["rows"]]
    page = (out / "report.html").read_text()
    assert page.count("<svg") >= len([r for r in data["rows"] if r["series"]])
    assert "scale" in page and "loss" in page


def test_schema_check_rejects_a_row_without_its_reason():
    row = {"scenario": "s", "reference": "torch", "subject": "exact", "device": "cpu", "dtype": "float32",
           "verdict": "skipped", "reason": "", "max_abs_diff": 0.0, "steps": 1, "first_divergence": None,
           "series": {}}
    with pytest.raises(ValueError, match="needs a reason"):
        validate_report({"version": 1, "environment": {}, "summary": {}, "rows": [row]})


def _skips_the_wrong_step(scale, tracker, found_inf, *args, **kwargs):
    """A planted bug: the scale update ignores overflows (never backs off)."""
    from roundpipe.scaling import update_scale_

    update_scale_(scale, tracker, torch.zeros_like(found_inf), *args, **kwargs)


def _unscales_with_the_wrong_value(scale):
    """A planted bug: unscale by a value one ulp-ish away from 1/scale."""
    return (scale.double().reciprocal() * 1.001).float()


@pytest.mark.parametrize("name, bug", [("update_scale_", _skips_the_wrong_step),
                                       ("reciprocal_scale", _unscales_with_the_wrong_value)])
def test_a_planted_bug_makes_the_matrix_fail(name, bug, monkeypatch, tmp_path):
    monkeypatch.setattr(grad_scaler_module, name, bug)
    code = main(["--scenario", "forced_overflow", "--scenario", "clean", "--steps", "8", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "report.json").read_text())
    assert code == 1
    diverged = [r for r in data["rows"] if r["verdict"] == "diverged"]
    assert {r["subject"] for r in diverged} >= {"dropin", "exact"}
    assert all(r["first_divergence"] is not None for r in diverged)


@pytest.mark.parametrize("name", ["clean", "forced_overflow", "growth", "nan_loss", "clipping",
                                  "fused_adam", "fp16_master_weights", "resume_apex_format"])
def test_apex_column_plumbing_with_a_stand_in_for_apex(name, monkeypatch):
    """The apex runner and its roundpipe.compat counterpart, driven by tests/fake_apex (apex's
    documented rule): the same scale trajectory and skipped steps. The real apex rows run
    only where apex <= 25.05 and CUDA exist."""
    import pathlib
    import sys

    from compat_matrix.apex_column import APEX_BOUND, apex_skip_reason, run_apex, run_compat
    from compat_matrix.compare import compare_traces
    from compat_matrix.scenarios import SCENARIOS

    monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent / "fake_apex"))
    monkeypatch.delitem(sys.modules, "apex", raising=False)
    monkeypatch.delitem(sys.modules, "apex.amp", raising=False)
    scenario = next(s for s in SCENARIOS if s.name == name)
    assert apex_skip_reason(scenario) is None
    reference, ours = run_apex(scenario, "cpu"), run_compat(scenario, "cpu")
    assert reference.scales == ours.scales
    assert reference.skipped == ours.skipped
    assert compare_traces(reference, ours, APEX_BOUND).verdict in ("bitwise", "close")


@pytest.mark.parametrize("name", ["clean", "bf16_autocast", "microbatches"])
def test_logged_loss_is_the_original_loss_at_the_largest_scale(name):
    """At scale 2**127 (where a clean or bf16 run ends up after enough growth) loss x scale
    overflows float32; the RoundPipe columns must still log the true loss, so the matrix
    does not report a false divergence."""
    import dataclasses

    from compat_matrix.compare import compare_traces
    from compat_matrix.runners import RUNNERS
    from compat_matrix.scenarios import SCENARIOS

    scenario = dataclasses.replace(next(s for s in SCENARIOS if s.name == name), init_scale=2.0**127)
    torch_trace, exact = RUNNERS["torch"](scenario, "cpu"), RUNNERS["exact"](scenario, "cpu")
    reference, lagged = RUNNERS["async_reference"](scenario, "cpu"), RUNNERS["async"](scenario, "cpu")
    expected = "close" if scenario.microbatches > 1 else "bitwise"
    assert compare_traces(torch_trace, exact, 1e-5).verdict == expected
    assert compare_traces(reference, lagged, 1e-5).verdict == expected
    assert max(torch_trace.losses) * 2.0**127 > torch.finfo(torch.float32).max  # it overflows
    assert all(math.isfinite(v) for v in exact.losses + lagged.losses)
    assert lagged.losses[0] == pytest.approx(torch_trace.losses[0], rel=1e-6)


def _matrix_must_not_run(*args, **kwargs):
    raise AssertionError("the matrix ran before the arguments were checked")


@pytest.mark.parametrize("argv, message", [
    (["--out", ""], "must not be empty"),
    (["--out", "   "], "must not be empty"),
    (["--steps", "1"], "between 2 and"),
    (["--steps", "10001"], "between 2 and 10000"),
])
def test_bad_arguments_are_usage_errors_before_the_matrix_runs(argv, message, monkeypatch, capsys):
    monkeypatch.setattr("compat_matrix.cli.run_matrix", _matrix_must_not_run)
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "clean"] + argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("where", ["a_file", "under_a_file", "read_only"])
def test_an_unwritable_out_folder_is_a_usage_error_before_the_matrix_runs(where, tmp_path, monkeypatch, capsys):
    import os

    blocker = tmp_path / "report.md"
    blocker.write_text("not a folder")
    out = {"a_file": blocker, "under_a_file": blocker / "parity", "read_only": tmp_path / "locked"}[where]
    if where == "read_only":
        if os.geteuid() == 0:
            pytest.skip("root can write into a read-only folder")
        out.mkdir()
        out.chmod(0o500)
    monkeypatch.setattr("compat_matrix.cli.run_matrix", _matrix_must_not_run)
    with pytest.raises(SystemExit) as exited:
        main(["--scenario", "clean", "--out", str(out)])
    assert exited.value.code == 2
    assert "cannot write the reports to" in capsys.readouterr().err
