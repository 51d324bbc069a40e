"""The parity report in three forms: Markdown (a person reads it first), JSON (everything,
for tools) and HTML (the table plus plots: scale trajectory and loss curves, reference
against subject). The plots are inline SVG drawn here, so no plotting library is needed.
"""

from __future__ import annotations

import html
import json
import math
import pathlib
from collections import Counter
from typing import Any, Dict, List, Sequence

__all__ = ["write_reports", "ROW_FIELDS", "validate_report", "VERDICTS"]

VERDICTS = ("bitwise", "close", "diverged", "skipped")
ROW_FIELDS: Dict[str, tuple] = {
    "scenario": (str,), "reference": (str,), "subject": (str,), "device": (str,), "dtype": (str,),
    "verdict": (str,), "reason": (str,), "max_abs_diff": (int, float), "steps": (int,),
    "first_divergence": (int, type(None)), "series": (dict,),
}
_COLUMNS = ("scenario", "reference", "subject", "device", "dtype", "verdict", "max_abs_diff", "reason")


def validate_report(data: Dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``data`` has the report.json schema."""
    for key, kind in (("version", int), ("environment", dict), ("summary", dict), ("rows", list)):
        if not isinstance(data.get(key), kind):
            raise ValueError(f"report.json: {key!r} missing or not a {kind.__name__}")
    for index, row in enumerate(data["rows"]):
        for name, kinds in ROW_FIELDS.items():
            if name not in row or not isinstance(row[name], kinds):
                raise ValueError(f"report.json row {index}: field {name!r} missing or mistyped")
        if row["verdict"] not in VERDICTS:
            raise ValueError(f"report.json row {index}: unknown verdict {row['verdict']!r}")
        if row["verdict"] in ("close", "skipped", "diverged") and not row["reason"]:
            raise ValueError(f"report.json row {index}: a {row['verdict']} row needs a reason")


def _summary(rows: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    counts = Counter(row["verdict"] for row in rows)
    return {verdict: counts.get(verdict, 0) for verdict in VERDICTS}


def _cell(row: Dict[str, Any], column: str) -> str:
    value = row[column]
    if column == "max_abs_diff":
        return "0" if value == 0 else f"{value:.3g}"
    return str(value).replace("|", "\\|")


def _markdown(rows, environment, command) -> str:
    summary = _summary(rows)
    lines = [
        "# roundpipe-parity report",
        "",
        f"`{command}` — {environment['date']}, torch {environment['torch']}, "
        f"CUDA {'yes: ' + ', '.join(environment['cuda_devices']) if environment['cuda_available'] else 'no'}, "
        f"apex {environment['apex'] or 'not installed'}.",
        "",
        "Summary: " + ", ".join(f"{count} {verdict}" for verdict, count in summary.items()),
        "",
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "---|" * len(_COLUMNS),
    ]
    lines += ["| " + " | ".join(_cell(row, c) for c in _COLUMNS) + " |" for row in rows]
    lines += ["", "## Details", ""]
    for row in rows:
        series = row["series"]
        if "scales_subject" in series:
            lines.append(f"- **{row['scenario']}** ({row['device']}, {row['subject']}): scale sequence "
                         f"{_compact(series['scales_subject'])}; reference {_compact(series['scales_reference'])}")
    return "\n".join(lines) + "\n"


def _compact(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:g}" for v in values) + "]"


def _svg_plot(title: str, reference: Sequence[float], subject: Sequence[float], log2: bool) -> str:
    """A small line chart: reference (solid) against subject (dashed)."""
    width, height, pad = 360, 160, 30

    def transform(values):
        return [math.log2(v) if log2 and v > 0 else v for v in values if math.isfinite(v)]

    ref, sub = transform(reference), transform(subject)
    values = ref + sub or [0.0]
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    count = max(len(reference), len(subject), 2)

    def points(series):
        return " ".join(
            f"{pad + i * (width - 2 * pad) / (count - 1):.1f},{height - pad - (v - low) / span * (height - 2 * pad):.1f}"
            for i, v in enumerate(series)
        )

    label = "log2 scale" if log2 else "loss"
    return (
        f'<svg class="plot" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{html.escape(title)}">'
        f'<title>{html.escape(title)}</title>'
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="white" stroke="#ccc"/>'
        f'<text x="{pad}" y="16" font-size="11">{html.escape(title)} ({label}: {low:.3g}..{high:.3g})</text>'
        f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{points(ref)}"/>'
        f'<polyline fill="none" stroke="#d62728" stroke-width="1.5" stroke-dasharray="4 3" points="{points(sub)}"/>'
        f'<text x="{pad}" y="{height - 8}" font-size="10" fill="#1f77b4">reference</text>'
        f'<text x="{pad + 70}" y="{height - 8}" font-size="10" fill="#d62728">subject</text>'
        "</svg>"
    )


def _html(rows, environment, command) -> str:
    table = "".join(
        f'<tr class="{row["verdict"]}">' + "".join(f"<td>{html.escape(_cell(row, c))}</td>" for c in _COLUMNS) + "</tr>"
        for row in rows
    )
    plots = []
    for row in rows:
        series = row["series"]
        charts = []
        if series.get("scales_reference") is not None and "scales_subject" in series:
            charts.append(_svg_plot(f"{row['scenario']}: scale", series["scales_reference"], series["scales_subject"], True))
        if "losses_reference" in series:
            charts.append(_svg_plot(f"{row['scenario']}: loss", series["losses_reference"], series["losses_subject"], False))
        if charts:
            plots.append(f"<section><h3>{html.escape(row['scenario'])} — {html.escape(row['reference'])} vs "
                         f"{html.escape(row['subject'])} ({html.escape(row['device'])}): "
                         f"{html.escape(row['verdict'])}</h3>{''.join(charts)}</section>")
    summary = ", ".join(f"{count} {verdict}" for verdict, count in _summary(rows).items())
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>roundpipe-parity report</title>"
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;font-size:13px}tr.diverged{background:#fdd}"
        "tr.skipped{color:#777}tr.close{background:#ffe}.plot{margin:4px}</style></head><body>"
        f"<h1>roundpipe-parity report</h1><p><code>{html.escape(command)}</code> — "
        f"{html.escape(json.dumps(environment))}</p><p>Summary: {summary}</p>"
        "<table><tr>" + "".join(f"<th>{c}</th>" for c in _COLUMNS) + f"</tr>{table}</table>"
        f"<h2>Plots</h2>{''.join(plots)}</body></html>\n"
    )


def write_reports(out: pathlib.Path, rows: List[Dict[str, Any]], environment: Dict[str, Any],
                  command: str) -> Dict[str, Any]:
    """Write ``report.md``, ``report.json`` and ``report.html`` under ``out``; return the JSON."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "command": command, "environment": environment,
            "summary": _summary(rows), "rows": rows}
    validate_report(data)
    (out / "report.json").write_text(json.dumps(data, indent=1, allow_nan=True) + "\n")
    (out / "report.md").write_text(_markdown(rows, environment, command))
    (out / "report.html").write_text(_html(rows, environment, command))
    return data
