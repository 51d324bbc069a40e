"""The parity report in three forms: Markdown (a person reads it first), JSON (everything,
for tools) and HTML (one self-contained page: the run, a key to the columns and subjects,
the table with a link from every row to its plot and its docs page, and the plots drawn by
:mod:`compat_matrix.plots`).
"""

from __future__ import annotations

import html
import json
import os
import pathlib
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .plots import abs_differences, diff_panel, series_panel

__all__ = ["write_reports", "ROW_FIELDS", "validate_report", "VERDICTS", "REPORT_FILES", "row_panels"]

VERDICTS = ("bitwise", "close", "diverged", "skipped")
REPORT_FILES = ("report.md", "report.json", "report.html")
ROW_FIELDS: Dict[str, tuple] = {
    "scenario": (str,),
    "reference": (str,),
    "subject": (str,),
    "device": (str,),
    "dtype": (str,),
    "verdict": (str,),
    "reason": (str,),
    "max_abs_diff": (int, float),
    "steps": (int,),
    "first_divergence": (int, type(None)),
    "series": (dict,),
}
DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"

# (column, heading, what it means)
COLUMNS: Tuple[Tuple[str, str, str], ...] = (
    (
        "scenario",
        "scenario",
        "the seeded training run (its faults, optimizer, dtype); example:NAME is a script from examples/",
    ),
    ("reference", "reference", "who trains the run the subject must match"),
    ("subject", "subject", "who trains the run under test"),
    ("device", "device", "where both trained"),
    ("dtype", "dtype", "the model's dtype, and the autocast dtype where autocast is on"),
    ("verdict", "verdict", "bitwise, close, diverged or skipped (below)"),
    (
        "max_abs_diff",
        "max abs diff",
        "the largest absolute difference found over every parameter, loss "
        "and optimizer-state value (a measurement; a dash where nothing ran)",
    ),
    (
        "reason",
        "reason",
        "why the verdict holds: for close rows, the bound the row allows and what it "
        "covers; for skipped rows, why nothing ran",
    ),
)
VERDICT_TEXT = {
    "bitwise": "identical bits at every step: scales, skipped steps, losses, every parameter, the "
    "final optimizer and scaler state",
    "close": "scale and skipped steps identical, every value within the bound stated in the reason",
    "diverged": "a failure: the run parts from its reference (the reason names the first step)",
    "skipped": "not run here; the reason says why (no CUDA, no apex, no counterpart)",
}
# (subject key, label, what it is, docs page)
SUBJECTS: Tuple[Tuple[str, str, str, str], ...] = (
    ("torch", "torch", "reference: torch.amp.GradScaler in a plain training loop", "gradscaler.md"),
    ("dropin", "dropin", "drop-in: roundpipe.GradScaler in the very same plain loop", "gradscaler.md"),
    (
        "exact",
        "exact",
        "RoundPipe runtime in exact mode: step(is_async=False) and update(is_async=False)",
        "runtime.md",
    ),
    (
        "async_reference",
        "async_reference",
        "async reference: a plain-torch loop, written without roundpipe "
        "code, that applies each update one step late and follows the lagged scale rule",
        "gradscaler.md",
    ),
    (
        "async",
        "async",
        "RoundPipe runtime in its default asynchronous mode (step and update on the optimizer thread)",
        "runtime.md",
    ),
    ("apex", "apex O1 / O2", "reference: NVIDIA apex amp (<= 25.05) in a plain loop, CUDA only", "apex.md"),
    ("roundpipe.compat", "roundpipe.compat", "the apex API as migrated apex scripts call it, in exact mode", "apex.md"),
    ("original", "original", "migrated examples: the script in examples/ as written (reference)", "migrate.md"),
    (
        "migrated --exact",
        "migrated --exact",
        "migrated examples: the output of roundpipe-migrate --exact (must print the same numbers)",
        "migrate.md",
    ),
    (
        "migrated (async)",
        "migrated (async)",
        "migrated examples: the default (asynchronous) migration; "
        "weights one step stale and the scale one step late by design",
        "migrate.md",
    ),
)
_SUBJECT_DOCS = {key: page for key, _, _, page in SUBJECTS}


def validate_report(data: Dict[str, Any]) -> None:
    """Raise ``ValueError`` unless ``data`` has the report.json schema."""
    for key, kind in (("version", int), ("environment", dict), ("summary", dict), ("rows", list)):
        if not isinstance(data.get(key), kind):
            raise ValueError(f"report.json: {key!r} missing or not a {kind.__name__}")
    for index, row in enumerate(data["rows"]):
        for name, kinds in ROW_FIELDS.items():
            if name not in row or not isinstance(row[name], kinds):
                raise ValueError(f"report.json row {index}: field {name!r} missing or mistyped")
        if not isinstance(row.get("bound"), (int, float, type(None))):
            raise ValueError(f"report.json row {index}: 'bound' is not a number")
        if row["verdict"] not in VERDICTS:
            raise ValueError(f"report.json row {index}: unknown verdict {row['verdict']!r}")
        if row["verdict"] in ("close", "skipped", "diverged") and not row["reason"]:
            raise ValueError(f"report.json row {index}: a {row['verdict']} row needs a reason")


def _summary(rows: Sequence[Dict[str, Any]]) -> Dict[str, int]:
    counts = Counter(row["verdict"] for row in rows)
    return {verdict: counts.get(verdict, 0) for verdict in VERDICTS}


def _summary_text(rows: Sequence[Dict[str, Any]]) -> str:
    return ", ".join(f"{count} {verdict}" for verdict, count in _summary(rows).items())


def _subject_key(name: str) -> str:
    """The glossary entry for a reference or subject name (``apex O2`` -> ``apex``)."""
    if name in _SUBJECT_DOCS:
        return name
    first = name.split()[0]
    return first if first in _SUBJECT_DOCS else name


def _cell_text(row: Dict[str, Any], column: str) -> str:
    value = row[column]
    if column == "max_abs_diff":
        if row["verdict"] == "skipped":
            return "—"
        return "0" if value == 0 else f"{value:.3g}"
    return str(value)


def _md(text: str) -> str:
    """A Markdown table cell: a pipe written as an entity, so no backslash shows anywhere."""
    return text.replace("|", "&#124;").replace("\n", " ")


def _environment_items(environment: Dict[str, Any], command: str) -> List[Tuple[str, str]]:
    """The run's header as (label, value) pairs, in reading order."""
    cuda = ("yes: " + ", ".join(environment.get("cuda_devices") or [])) if environment.get("cuda_available") else "no"
    items = [
        ("date (UTC)", environment.get("date", "")),
        ("command", command),
        ("torch", environment.get("torch", "")),
        ("Python", environment.get("python", "")),
        ("platform", environment.get("platform", "")),
        ("CPU", environment.get("cpu", "")),
        ("CUDA", cuda),
        ("apex", environment.get("apex") or "not installed"),
    ]
    return [(label, str(value)) for label, value in items]


_GRID_LABELS = {"dropin": "drop-in", "roundpipe.compat": "apex → compat"}


def _grid_label(row: Dict[str, Any]) -> str:
    key = _subject_key(row["subject"])
    return _GRID_LABELS.get(key, key)


def _verdict_grids(rows: Sequence[Dict[str, Any]]) -> List[Tuple[List[str], List[List[str]]]]:
    """Verdicts at a glance, as (header, lines) tables: one line per scenario and device, one
    column per subject; the example scripts get a table of their own (their subjects are not
    the scenarios')."""
    grids = []
    for examples in (False, True):
        group = [row for row in rows if row["scenario"].startswith("example:") == examples]
        if not group:
            continue
        columns = list(dict.fromkeys(_grid_label(row) for row in group))
        cells: Dict[Tuple[str, str], Dict[str, str]] = {}
        for row in group:
            found = cells.setdefault((row["scenario"], row["device"]), {"dtype": row["dtype"]})
            found[_grid_label(row)] = row["verdict"]
        header = ["example" if examples else "scenario", "device", "dtype"] + columns
        lines = [
            [name.removeprefix("example:"), device, found["dtype"]] + [found.get(c, "") for c in columns]
            for (name, device), found in cells.items()
        ]
        grids.append((header, lines))
    return grids


def _markdown_grid(rows: Sequence[Dict[str, Any]]) -> List[str]:
    """:func:`_verdict_grids` as Markdown tables, a blank line between them."""
    out: List[str] = []
    for header, lines in _verdict_grids(rows):
        if out:
            out.append("")
        out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        out += ["| " + " | ".join(_md(cell) for cell in line) + " |" for line in lines]
    return out


def _html_grids(rows: Sequence[Dict[str, Any]]) -> str:
    tables = []
    for header, lines in _verdict_grids(rows):
        head = "".join(f"<th>{html.escape(cell)}</th>" for cell in header)
        body = "".join(
            "<tr>"
            + "".join(
                f'<td><span class="verdict {html.escape(cell)}">{html.escape(cell)}</span></td>'
                if i >= 3 and cell
                else f"<td>{html.escape(cell)}</td>"
                for i, cell in enumerate(line)
            )
            + "</tr>"
            for line in lines
        )
        tables.append(
            f'<div class="wrap"><table class="grid"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
        )
    return "".join(tables)


def _markdown(rows: Sequence[Dict[str, Any]], environment: Dict[str, Any], command: str) -> str:
    lines = ["# roundpipe-parity report", "", "| run | |", "|---|---|"]
    lines += [
        f"| {label} | {_md(f'`{value}`' if label == 'command' else value)} |"
        for label, value in _environment_items(environment, command)
    ]
    lines += ["", f"Summary: {_summary_text(rows)}.", "", "## At a glance", ""] + _markdown_grid(rows)
    lines += ["", "## Every row", "", "| " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_md(_cell_text(row, c)) for c, _, _ in COLUMNS) + " |" for row in rows]
    lines += ["", "## What the columns mean", ""]
    lines += [f"- **{heading}**: {text}." for _, heading, text in COLUMNS]
    lines += ["", "Verdicts:", ""] + [f"- **{verdict}**: {text}." for verdict, text in VERDICT_TEXT.items()]
    lines += ["", "Subjects and references:", ""] + [
        f"- **{label}**: {text} (docs/{page})." for _, label, text, page in SUBJECTS
    ]
    return "\n".join(lines) + "\n"


def _link(href: str, text: str, attrs: str = "") -> str:
    return f'<a href="{html.escape(href)}"{attrs}>{html.escape(text)}</a>'


def _row_title(row: Dict[str, Any]) -> str:
    return f"{row['scenario']}: {row['reference']} vs {row['subject']} ({row['device']})"


def row_panels(row: Dict[str, Any], prefix: str = "") -> Tuple[List[Tuple[str, str]], List[str]]:
    """The plots of one row as (kind, svg) pairs, kind one of ``scale``, ``scale-diff``,
    ``loss`` and ``loss-diff``, and a note for each difference panel left out because the
    difference is 0 at every step. ``prefix`` starts every title. Skipped rows have neither."""
    series = row["series"]
    names = (row["reference"], row["subject"])
    panels, notes = [], []
    metrics = []
    if series.get("scales_reference") is not None and "scales_subject" in series:
        metrics.append(("loss scale", "scale (log2 axis)", "scales", "scale", "log2"))
    if "losses_reference" in series:
        metrics.append(("loss", "loss", "losses", "loss", "linear"))
    for title, y_label, key, kind, scale in metrics:
        reference, subject = series[f"{key}_reference"], series[f"{key}_subject"]
        panels.append(
            (
                kind,
                series_panel(
                    f"{prefix}{title} per step",
                    y_label,
                    reference,
                    subject,
                    names,
                    scale,
                    series.get("skipped_reference", ()),
                    series.get("skipped_subject", ()),
                ),
            )
        )
        differences = abs_differences(reference, subject)
        if any(differences) or len(reference) != len(subject):
            panels.append(
                (
                    f"{kind}-diff",
                    diff_panel(
                        f"{prefix}{title}: |subject − reference| per step",
                        differences,
                        row.get("bound") if key == "losses" else None,
                    ),
                )
            )
        else:
            notes.append(f"{title}: |subject − reference| = 0 at every step")
    return panels, notes


def _figure(index: int, row: Dict[str, Any]) -> Optional[str]:
    """The plots of one row, or None when it has no series (skipped rows)."""
    panels, notes = row_panels(row)
    if not panels:
        return None
    back = _link(f"#row-{index}", "back to the table")
    body = f'<div class="panels">{"".join(svg for _, svg in panels)}</div>' + "".join(
        f'<p class="note">{html.escape(note)}</p>' for note in notes
    )
    heading = (
        f'{html.escape(_row_title(row))}: <span class="verdict {html.escape(row["verdict"])}">'
        f"{html.escape(row['verdict'])}</span>"
    )
    if row["verdict"] == "bitwise":
        series = row["series"]
        steps = len(series.get("losses_reference") or series.get("scales_reference") or [])
        return (
            f'<details class="figure" id="plot-{index}"><summary>{heading} — identical at all {steps} '
            f"steps</summary><p>{back}</p>{body}</details>"
        )
    return (
        f'<section class="figure" id="plot-{index}"><h3>{heading}</h3>'
        f'<p class="reason">{html.escape(row["reason"])} ({back})</p>{body}</section>'
    )


def _table_row(index: int, row: Dict[str, Any], has_plot: bool, docs: str) -> str:
    cells = []
    for column, _, _ in COLUMNS:
        text = _cell_text(row, column)
        if column in ("reference", "subject"):
            cells.append(f"<td>{_link('#term-' + _slug(_subject_key(text)), text)}</td>")
        elif column == "verdict":
            cells.append(f'<td><span class="verdict {html.escape(text)}">{html.escape(text)}</span></td>')
        else:
            cells.append(f'<td class="{column}">{html.escape(text)}</td>')
    page = _SUBJECT_DOCS.get(_subject_key(row["subject"]), "parity.md")
    plot = _link(f"#plot-{index}", "plot") if has_plot else '<span class="none">no plot</span>'
    cells.append(f'<td class="links">{plot} · {_link(f"{docs}/{page}", "docs")}</td>')
    return f'<tr id="row-{index}" class="{html.escape(row["verdict"])}">{"".join(cells)}</tr>'


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text.lower()).strip("-")


_CSS = """
body{font-family:system-ui,sans-serif;margin:0 auto;padding:1em 2em;max-width:1800px;color:#222;line-height:1.4}
h1{margin-bottom:.2em} code{background:#f4f4f4;padding:0 .2em;word-break:break-all}
table{border-collapse:collapse;font-size:13px}
td,th{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f0f0f0}
.wrap{overflow-x:auto;margin-bottom:1em} table.rows{width:100%}
td.dtype,td.links{white-space:nowrap} td.reason{min-width:18em}
td.max_abs_diff{font-variant-numeric:tabular-nums;white-space:nowrap}
.verdict{padding:0 .4em;border-radius:3px;font-weight:600}
.verdict.bitwise{background:#dcefdc}.verdict.close{background:#fff1b8}
.verdict.diverged{background:#f8c6c6}.verdict.skipped{background:#e8e8e8;color:#555}
tr.skipped td{color:#666} tr:target{outline:2px solid #1f5fa8}
dl.key{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;font-size:14px}
dl.key dt{font-weight:600} dl.key dd{margin:0}
.panels{display:grid;grid-template-columns:repeat(auto-fit,minmax(min(100%,480px),1fr));gap:12px;overflow-x:auto}
svg.plot{width:100%;min-width:440px;height:auto;display:block}
.figure{border-top:1px solid #ddd;padding:.6em 0}
details.figure summary{cursor:pointer}
.note,.reason{font-size:14px;color:#444;margin:.3em 0}
.none{color:#888}
@media (max-width:600px){body{padding:.5em}}
"""


def _html(rows: Sequence[Dict[str, Any]], environment: Dict[str, Any], command: str, docs: str) -> str:
    figures = [_figure(index, row) for index, row in enumerate(rows)]
    env = "".join(
        f"<tr><th>{html.escape(label)}</th><td>{html.escape(value)}</td></tr>"
        for label, value in _environment_items(environment, command)
    )
    head = "".join(f"<th>{html.escape(heading)}</th>" for _, heading, _ in COLUMNS) + "<th>see</th>"
    table = "".join(_table_row(index, row, figures[index] is not None, docs) for index, row in enumerate(rows))
    columns = "".join(f"<dt>{html.escape(heading)}</dt><dd>{html.escape(text)}</dd>" for _, heading, text in COLUMNS)
    verdicts = "".join(
        f'<dt><span class="verdict {v}">{v}</span></dt><dd>{html.escape(t)}</dd>' for v, t in VERDICT_TEXT.items()
    )
    subjects = "".join(
        f'<dt id="term-{_slug(key)}">{html.escape(label)}</dt><dd>{html.escape(text)} '
        f"({_link(f'{docs}/{page}', 'docs/' + page)})</dd>"
        for key, label, text, page in SUBJECTS
    )
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>roundpipe-parity report</title><style>{_CSS}</style></head><body>"
        "<h1>roundpipe-parity report</h1>"
        f'<table class="environment">{env}</table>'
        f"<p><strong>Summary:</strong> {html.escape(_summary_text(rows))}.</p>"
        f"<h2>At a glance</h2>{_html_grids(rows)}"
        f'<h2>How to read it</h2><dl class="key">{columns}</dl><h3>Verdicts</h3><dl class="key">{verdicts}</dl>'
        f'<h3>References and subjects</h3><dl class="key">{subjects}</dl>'
        f'<h2>Rows</h2><div class="wrap"><table class="rows"><thead><tr>{head}</tr></thead>'
        f"<tbody>{table}</tbody></table></div>"
        "<h2>Plots</h2><p>Solid: the reference; dashed: the subject. Rows that are identical bit for bit "
        "are folded to one line each.</p>" + "".join(figure for figure in figures if figure) + "</body></html>\n"
    )


def write_reports(
    out: pathlib.Path, rows: List[Dict[str, Any]], environment: Dict[str, Any], command: str
) -> Dict[str, Any]:
    """Write :data:`REPORT_FILES` under ``out``; return the JSON."""
    out.mkdir(parents=True, exist_ok=True)
    data = {"version": 1, "command": command, "environment": environment, "summary": _summary(rows), "rows": rows}
    validate_report(data)
    docs = pathlib.Path(os.path.relpath(DOCS, out.resolve())).as_posix()
    (out / "report.json").write_text(json.dumps(data, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    (out / "report.md").write_text(_markdown(rows, environment, command), encoding="utf-8")
    (out / "report.html").write_text(_html(rows, environment, command, docs), encoding="utf-8")
    return data
