"""Run the matrix: every scenario under every column, plus the example scripts.

Rows are plain dicts (the JSON report's schema). A row never claims a result it did not
run: a column that cannot run here (no CUDA, no apex, a combination with no exact
counterpart) is a ``skipped`` row with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import math
import pathlib
import platform
import re
import runpy
import sys
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from .apex_column import APEX_BOUND, APEX_REASON, APEX_SCENARIOS, apex_skip_reason, opt_level_for, run_apex, run_compat
from .compare import Verdict, compare_traces
from .runners import RUNNERS, Trace, apex_unavailable_reason
from .scenarios import SCENARIOS, Scenario

__all__ = ["run_matrix", "environment"]

ROOT = pathlib.Path(__file__).resolve().parent.parent
QUICK_STEPS = 8
QUICK_EXAMPLES = ("amp_basic.py", "amp_accumulation.py", "amp_train_function.py", "apex_o2_batchnorm.py")
MICROBATCH_BOUND = 1e-5
_STEP_LINE = re.compile(r"^step (\d+) loss (\S+)", re.M)

# (reference, subject, what the subject is): the columns compared for every scenario
PAIRS = (
    ("torch", "dropin", "roundpipe.GradScaler as a drop-in in the same plain loop"),
    ("torch", "exact", "RoundPipe, step(is_async=False) + update(is_async=False)"),
    ("async_reference", "async", "RoundPipe, default asynchronous step and update"),
)


def _dtype_label(scenario: Scenario) -> str:
    label = str(scenario.model_dtype).replace("torch.", "")
    if scenario.autocast is not None:
        label += " + autocast " + str(scenario.autocast).replace("torch.", "")
    return label


def _with_steps(scenario: Scenario, steps: Optional[int]) -> Scenario:
    if steps is None or steps == scenario.steps:
        return scenario
    resume = scenario.resume_at if scenario.resume_at is None else min(scenario.resume_at, steps // 2)
    return dataclasses.replace(scenario, steps=steps, faults=scenario.faults[:steps], resume_at=resume)


def _row(
    scenario: Scenario,
    reference: str,
    subject: str,
    device: str,
    verdict: str,
    reason: str,
    max_abs_diff: float = 0.0,
    first_divergence: Optional[int] = None,
    series: Optional[Dict[str, List[Any]]] = None,
    bound: Optional[float] = None,
) -> Dict[str, Any]:
    return {
        "scenario": scenario.name,
        "reference": reference,
        "subject": subject,
        "device": device,
        "dtype": _dtype_label(scenario),
        "verdict": verdict,
        "reason": reason,
        "max_abs_diff": max_abs_diff,
        "steps": scenario.steps,
        "first_divergence": first_divergence,
        "series": series or {},
        "bound": bound,
    }


def _bound_for(scenario: Scenario) -> Optional[float]:
    return MICROBATCH_BOUND if scenario.microbatches > 1 else None


def _skip_reason(scenario: Scenario, subject: str) -> Optional[str]:
    if subject == "async" and scenario.resume_at is not None and scenario.resume_format == "apex":
        return (
            "apex's amp.state_dict() has no field for the lagged mode's pending result, so an "
            "asynchronous run resumed from it is not exact; resume from the torch-format state dict"
        )
    return None


def _scenario_rows(scenario: Scenario, device: str) -> Iterable[Dict[str, Any]]:
    traces: Dict[str, Trace] = {}

    def trace(name: str) -> Trace:
        if name not in traces:
            traces[name] = RUNNERS[name](scenario, device)
        return traces[name]

    for reference, subject, _ in PAIRS:
        skip = _skip_reason(scenario, subject)
        if skip is not None:
            yield _row(scenario, reference, subject, device, "skipped", skip)
            continue
        ref, sub = trace(reference), trace(subject)
        verdict: Verdict = compare_traces(
            ref,
            sub,
            _bound_for(scenario),
            "2 microbatches add the loss in a different order than one full batch",
        )
        yield _compared_row(scenario, reference, subject, device, verdict, ref, sub, _bound_for(scenario))
    yield _apex_row(scenario, device)


def _compared_row(
    scenario: Scenario,
    reference: str,
    subject: str,
    device: str,
    verdict: Verdict,
    ref: Trace,
    sub: Trace,
    bound: Optional[float],
) -> Dict[str, Any]:
    """The row of a comparison that ran: its verdict, both series and the bound used."""
    return _row(
        scenario,
        reference,
        subject,
        device,
        verdict.verdict,
        verdict.reason,
        verdict.max_abs_diff,
        verdict.first_divergence,
        _series(ref, sub),
        bound,
    )


def _apex_row(scenario: Scenario, device: str) -> Dict[str, Any]:
    """apex amp against roundpipe.compat (the migrated apex form), where apex runs."""
    reason = apex_unavailable_reason(device) or apex_skip_reason(scenario)
    subject = f"roundpipe.compat {opt_level_for(scenario)} exact"
    if reason is not None:
        return _row(scenario, f"apex {opt_level_for(scenario)}", subject, device, "skipped", reason)
    reference, ours = run_apex(scenario, device), run_compat(scenario, device)
    verdict = compare_traces(reference, ours, APEX_BOUND, APEX_REASON)
    return _compared_row(
        scenario, f"apex {opt_level_for(scenario)}", subject, device, verdict, reference, ours, APEX_BOUND
    )


def _series(reference: Trace, subject: Trace) -> Dict[str, List[Any]]:
    """What the report plots: scale, skipped steps and loss per step, on both sides."""
    return {
        "scales_reference": reference.scales,
        "scales_subject": subject.scales,
        "skipped_reference": reference.skipped,
        "skipped_subject": subject.skipped,
        "losses_reference": reference.losses,
        "losses_subject": subject.losses,
    }


def _run_script(source: str, name: str) -> str:
    with tempfile.TemporaryDirectory() as folder:
        script = pathlib.Path(folder) / name
        script.write_text(source)
        out = io.StringIO()
        saved_argv, sys.argv = sys.argv, [str(script)]  # the script parses its own (empty) argv
        try:
            with contextlib.redirect_stdout(out):
                runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = saved_argv
    from roundpipe import optim_stream

    optim_stream.synchronize("the end of an example script")
    return out.getvalue()


def _losses(output: str) -> List[float]:
    return [float(value) for _, value in _STEP_LINE.findall(output)]


def _example_rows(names: Iterable[str]) -> Iterable[Dict[str, Any]]:
    from migrate.engine import migrate_source

    example = Scenario("example", "")
    for name in names:
        path = ROOT / "examples" / name
        source = path.read_text()
        scenario = dataclasses.replace(example, name=f"example:{name}", steps=0)
        exact = migrate_source(source, str(path), exact=True)
        default = migrate_source(source, str(path))
        if exact.status != "migrated":
            codes = ", ".join(d.code for d in exact.diagnostics)
            yield _row(
                scenario,
                "original",
                "migrated --exact",
                "cpu",
                "diverged",
                f"roundpipe-migrate did not migrate it ({codes})",
            )
            continue
        migrated_default = _losses(_run_script(default.migrated, name))
        if name.startswith("apex_"):
            yield _row(
                dataclasses.replace(scenario, steps=len(migrated_default)),
                "original (apex)",
                "migrated (async)",
                "cpu",
                "skipped",
                "the original needs apex and CUDA; its migrated form ran "
                f"{len(migrated_default)} steps on the CPU without apex",
            )
            continue
        original = _run_script(source, name)
        reference = _losses(original)
        scenario = dataclasses.replace(scenario, steps=len(reference))
        exact_output = _run_script(exact.migrated, name)
        same = exact_output == original
        yield _row(
            scenario,
            "original",
            "migrated --exact",
            "cpu",
            "bitwise" if same else "diverged",
            "identical printed numbers" if same else "printed numbers differ",
            series={"losses_reference": reference, "losses_subject": _losses(exact_output)},
        )
        diffs = [abs(a - b) for a, b in zip(reference, migrated_default)]
        bound = 0.5 * max(abs(v) for v in reference)
        finite = all(math.isfinite(v) for v in migrated_default)
        ok = len(migrated_default) == len(reference) and finite and max(diffs, default=0.0) <= bound
        yield _row(
            scenario,
            "original",
            "migrated (async)",
            "cpu",
            "close" if ok else "diverged",
            "asynchronous form by design (weights one step stale, scale one step late): every "
            f"step ran; tolerance per printed loss: half the original's largest loss, {bound:.3g}"
            if ok
            else "the asynchronous migration did not run every step with comparable losses",
            max(diffs, default=0.0),
            series={"losses_reference": reference, "losses_subject": migrated_default},
            bound=bound,
        )


def run_matrix(
    device: str = "cpu",
    quick: bool = False,
    scenarios: Optional[List[str]] = None,
    steps: Optional[int] = None,
    progress: Optional[Callable[[int, int, str], None]] = None,
) -> List[Dict[str, Any]]:
    """All rows for ``device`` (``cpu``, ``cuda`` or ``all``).

    ``progress(done, total, label)`` is called before each scenario and example script runs.
    """
    chosen = [s for s in SCENARIOS if not scenarios or s.name in scenarios]
    apex_only = [s for s in APEX_SCENARIOS if not scenarios or s.name in scenarios]
    if scenarios:
        unknown = set(scenarios) - {s.name for s in SCENARIOS + APEX_SCENARIOS}
        if unknown:
            raise ValueError(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    steps = steps if steps is not None else (QUICK_STEPS if quick else None)
    devices = ["cpu", "cuda"] if device == "all" else [device]
    names: Iterable[str] = ()
    if not scenarios:
        names = (
            QUICK_EXAMPLES
            if quick
            else sorted(p.name for p in (ROOT / "examples").glob("a*_*.py") if p.name.startswith(("amp_", "apex_")))
        )
    units: List[Tuple[str, str, Any]] = []
    for dev in devices:
        units += [("scenario", dev, scenario) for scenario in chosen]
        units += [("apex", dev, scenario) for scenario in apex_only]
    units += [("example", "cpu", name) for name in names]
    report = progress or (lambda done, total, label: None)
    rows: List[Dict[str, Any]] = []
    for done, (kind, dev, unit) in enumerate(units):
        report(done, len(units), f"{unit if kind == 'example' else unit.name} ({dev})")
        if kind == "example":
            rows.extend(_example_rows([unit]))
            continue
        scenario = _with_steps(unit, steps)
        if kind == "apex":
            rows.append(_apex_row(scenario, dev))
        elif dev == "cuda" and not torch.cuda.is_available():
            rows.extend(
                _row(scenario, ref, sub, dev, "skipped", "CUDA is not available on this machine")
                for ref, sub, _ in PAIRS
            )
        else:
            rows.extend(_scenario_rows(scenario, dev))
    return rows


def environment() -> Dict[str, Any]:
    """Where the matrix ran: versions and devices (apex version or its absence)."""
    try:
        import apex  # noqa: F401

        apex_version = getattr(apex, "__version__", "present (version unknown)")
    except Exception:  # noqa: BLE001
        apex_version = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "cpu": platform.processor() or platform.machine(),
        "apex": apex_version,
    }
