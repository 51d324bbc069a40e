"""roundpipe-parity: the quick CPU matrix passes, a planted bug makes it fail, and the three
report files agree with each other and with the JSON schema."""

import json

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
    rows = {(r["scenario"], r["reference"], r["subject"]): r for r in data["rows"]}
    assert rows[("bf16_autocast", "torch", "exact")]["dtype"] == "float32 + autocast bfloat16"
    assert rows[("fp16_autocast", "torch", "exact")]["dtype"] == "float32 + autocast float16"
    close = rows[("microbatches", "torch", "exact")]["reason"]
    assert "bound" in close and "1e-05 (absolute)" in close
    example = rows[("example:amp_basic.py", "original", "migrated (async)")]
    assert "tolerance per printed loss: half the original's largest loss" in example["reason"]
    assert example["bound"] == pytest.approx(0.5 * max(example["series"]["losses_reference"]))
    skipped = [r for r in data["rows"] if r["verdict"] == "skipped"]
    assert skipped and all(r["reason"] for r in skipped)
    if not torch.cuda.is_available():
        assert all(r["device"] == "cpu" for r in data["rows"])


def test_report_files_agree_and_follow_the_schema(quick_report):
    _, out, data = quick_report
    validate_report(data)
    assert data["environment"]["torch"] == torch.__version__
    markdown = (out / "report.md").read_text(encoding="utf-8")
    table = markdown.split("## Every row\n\n", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    parsed = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table]
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
