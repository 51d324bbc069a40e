"""What a reader of the parity report sees: the Markdown table, the HTML page and its plots,
and the roundpipe-parity command line (help, progress, the last line, the CUDA note).

The reports are rendered from hand-made rows, so these tests run in milliseconds; the
rows from a real matrix run are checked in tests/test_parity.py."""

import io
import math
import re
import xml.etree.ElementTree as ET

import pytest
import torch

from compat_matrix import cli, export_plots
from compat_matrix.plots import abs_differences, diff_panel, series_panel
from compat_matrix.progress import Progress
from compat_matrix.report import REPORT_FILES, validate_report, write_reports
from compat_matrix.scenarios import scenario_names

ENVIRONMENT = {
    "date": "2026-12-01T09:00:00+00:00",
    "python": "3.11.7",
    "platform": "Linux-x86_64",
    "torch": "2.13.0+cpu",
    "cuda_available": False,
    "cuda_devices": [],
    "cpu": "x86_64",
    "apex": None,
}


def _row(scenario, subject, verdict, reason, max_abs_diff=0.0, series=None, **extra):
    row = {
        "scenario": scenario,
        "reference": "torch",
        "subject": subject,
        "device": "cpu",
        "dtype": "float32",
        "verdict": verdict,
        "reason": reason,
        "max_abs_diff": max_abs_diff,
        "steps": 4,
        "first_divergence": None,
        "series": series or {},
    }
    row.update(extra)
    return row


def _series(scales_subject, losses_subject, skipped=(False, True, False, False)):
    return {
        "scales_reference": [8.0, 8.0, 4.0, 4.0],
        "scales_subject": scales_subject,
        "skipped_reference": list(skipped),
        "skipped_subject": list(skipped),
        "losses_reference": [1.0, float("nan"), 0.5, 0.25],
        "losses_subject": losses_subject,
    }


ROWS = [
    _row(
        "clean",
        "dropin",
        "bitwise",
        "identical bits at every step",
        series=_series([8.0, 8.0, 4.0, 4.0], [1.0, float("nan"), 0.5, 0.25]),
    ),
    _row(
        "microbatches",
        "exact",
        "close",
        "summation order; bound: every value within 1e-05 (absolute)",
        3.6e-7,
        series=_series([8.0, 8.0, 4.0, 4.0], [1.0, float("nan"), 0.5 + 3.6e-7, 0.25]),
        bound=1e-5,
    ),
    _row("<script>alert('x')</script>", "async", "skipped", "needs A & B | C <now>"),
]


@pytest.fixture()
def written(tmp_path):
    write_reports(tmp_path, ROWS, ENVIRONMENT, "roundpipe-parity --out <dir>")
    return tmp_path


def _table_lines(markdown, section="## Every row"):
    lines = markdown.split(section, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| "))
    end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
    return lines[start + 2 : end]


def test_markdown_table_has_no_backslashes_and_a_dash_for_skipped_rows(written):
    markdown = (written / "report.md").read_text(encoding="utf-8")
    table = _table_lines(markdown)
    assert len(table) == len(ROWS)
    assert not any("\\" in line for line in table)
    cells = [[c.strip() for c in line.split("|")[1:-1]] for line in table]
    assert all(len(c) == 8 for c in cells), "a pipe inside a cell split it"
    by_verdict = {c[5]: c for c in cells}
    assert by_verdict["skipped"][6] == "—"
    assert by_verdict["bitwise"][6] == "0"
    assert by_verdict["close"][6] == "3.6e-07"
    assert "needs A & B &#124; C" in by_verdict["skipped"][7]


def test_markdown_grid_gives_one_verdict_per_scenario_and_subject(tmp_path):
    rows = ROWS[:2] + [
        _row("clean", "exact", "bitwise", "identical bits at every step"),
        _row("example:amp_basic.py", "migrated (async)", "close", "tolerance 2.74"),
    ]
    write_reports(tmp_path, rows, ENVIRONMENT, "roundpipe-parity")
    markdown = (tmp_path / "report.md").read_text(encoding="utf-8")
    grid = markdown.split("## At a glance", 1)[1].split("## Every row", 1)[0]
    assert "| scenario | device | dtype | drop-in | exact |" in grid
    assert "| clean | cpu | float32 | bitwise | bitwise |" in grid
    assert "| microbatches | cpu | float32 |  | close |" in grid
    assert "| example | device | dtype | migrated (async) |" in grid
    assert "| amp_basic.py | cpu | float32 | close |" in grid


def test_html_grid_shows_the_same_verdicts(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    grid = page.split("<h2>At a glance</h2>", 1)[1].split("<h2>", 1)[0]
    assert "<th>drop-in</th><th>exact</th><th>async</th>" in grid
    assert '<td>clean</td><td>cpu</td><td>float32</td><td><span class="verdict bitwise">bitwise</span></td>' in grid
    assert '<span class="verdict close">close</span>' in grid


def test_markdown_environment_is_a_table_not_a_dict(written):
    markdown = (written / "report.md").read_text(encoding="utf-8")
    assert "{" not in markdown.split("| scenario |")[0]
    assert "| torch | 2.13.0+cpu |" in markdown
    assert "| CUDA | no |" in markdown and "| apex | not installed |" in markdown
    for subject in ("reference", "drop-in", "exact", "async reference", "migrated --exact", "migrated (async)"):
        assert subject in markdown


def test_html_escapes_every_user_string(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "needs A &amp; B | C &lt;now&gt;" in page
    assert "roundpipe-parity --out &lt;dir&gt;" in page


def test_html_is_one_self_contained_file(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img|iframe)\b", page)
    assert " src=" not in page
    assert not re.findall(r'href="https?:', page)


def test_every_row_links_to_its_plot_and_its_docs(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    rows = re.findall(r'<tr id="row-(\d+)".*?</tr>', page, re.S)
    assert rows == [str(i) for i in range(len(ROWS))]
    for index, row in enumerate(ROWS):
        html_row = re.search(rf'<tr id="row-{index}".*?</tr>', page, re.S).group(0)
        assert re.search(r'href="[^"#]*docs/\w+\.md">docs</a>', html_row)
        if row["series"]:
            assert f'href="#plot-{index}"' in html_row
            assert f'id="plot-{index}"' in page
        else:
            assert "no plot" in html_row
    docs = set(re.findall(r'href="([^"#]*docs/\w+\.md)"', page))
    assert docs and all((written / href).resolve().is_file() for href in docs), docs


def test_bitwise_rows_fold_to_one_line_and_others_stay_open(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    folded = re.search(r'<details class="figure" id="plot-0"><summary>(.*?)</summary>', page, re.S)
    assert folded and "identical at all 4 steps" in folded.group(1)
    assert '<details class="figure" id="plot-1"' not in page
    assert '<section class="figure" id="plot-1">' in page


def test_plots_have_axes_ticks_legend_and_marks(written):
    page = (written / "report.html").read_text(encoding="utf-8")
    close = page.split('id="plot-1"')[1].split("</section>")[0]
    svgs = re.findall(r"<svg.*?</svg>", close, re.S)
    assert len(svgs) == 3  # scale, loss, and |subject - reference| of the loss (the scales agree)
    for svg in svgs:
        assert "optimizer step" in svg
        assert re.search(r'text-anchor="middle">3</text>', svg), "a tick for step 3"
        assert 'viewBox="0 0 ' in svg and "width=" not in svg.split(">")[0].replace("stroke-width", "")
    scale, loss, diff = svgs
    assert "reference: torch" in scale and "subject: exact" in scale
    assert "skipped step (overflow)" in scale
    assert ">4</text>" in scale and ">8</text>" in scale, "log2 ticks labelled with the scale itself"
    assert ">NaN/inf<" in loss
    assert "|subject − reference|" in diff and ">1e-7</text>" in diff
    assert "identical (0)" in diff and "bound 1e-05" in diff
    assert "loss scale: |subject − reference| = 0 at every step" in close


def test_a_step_skipped_by_one_side_only_is_marked():
    svg = series_panel(
        "t", "y", [1, 1, 1], [1, 1, 1], ("a", "b"), skipped=[False, True, False], subject_skipped=[False, False, False]
    )
    assert "skip differs" in svg


def test_differences_treat_matching_non_finite_values_as_equal():
    assert abs_differences([1.0, math.nan, math.inf, 2.0], [1.5, math.nan, math.inf, math.nan]) == [
        0.5,
        0.0,
        0.0,
        math.inf,
    ]
    assert "one side not finite" in diff_panel("t", [0.5, math.inf])


def test_help_documents_every_option_default_scenario_and_exit_code(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for option, default in (
        ("--device", "(default: cpu)"),
        ("--quick", "(default: off"),
        ("--scenario NAME", "(default: every scenario"),
        ("--steps N", "(default: each"),
        ("--out DIR", "(default: out/parity)"),
    ):
        block = text.split("\n  " + option, 1)[1].split("\n  --", 1)[0]
        assert default in " ".join(block.split()), option
    for name in scenario_names():
        assert re.search(rf"^  {name} +\S", text, re.M), name
    exits = text.split("exit status:")[1]
    assert all(re.search(rf"^  {code}  \S", exits, re.M) for code in (0, 1, 2))


def test_last_line_names_every_file_written(tmp_path, capsys):
    assert cli.main(["--scenario", "clean", "--steps", "2", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    named = lines[-1].removeprefix("roundpipe-parity: wrote ").split(", ")
    assert named == [str(tmp_path / name) for name in REPORT_FILES]
    assert all((tmp_path / name).is_file() for name in REPORT_FILES)
    assert not any("\r" in line for line in lines), "no progress line when stderr is not a terminal"


@pytest.mark.parametrize("device, rest", [("cuda", "reported as skipped\n"), ("all", "; the CPU rows run\n")])
def test_device_cuda_without_cuda_says_so_on_stderr(tmp_path, capsys, monkeypatch, device, rest):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli.main(["--device", device, "--scenario", "clean", "--steps", "2", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert f"--device {device}: CUDA is not available on this machine" in err
    assert "reported as skipped" in err and rest in err


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_shows_on_a_terminal_after_the_delay_and_is_erased():
    now = [0.0]
    stream = _Terminal()
    progress = Progress(stream, delay=2.0, clock=lambda: now[0])
    progress(0, 5, "clean (cpu)")
    assert stream.getvalue() == "", "nothing for the first seconds"
    now[0] = 3.0
    progress(1, 5, "growth (cpu)")
    assert stream.getvalue() == "\rroundpipe-parity: [2/5] growth (cpu), 3 s"
    progress.close()
    assert stream.getvalue().endswith("\r")
    assert stream.getvalue().split("\r")[-2].strip() == ""


def test_progress_stays_silent_off_a_terminal():
    stream = io.StringIO()
    progress = Progress(stream, delay=0.0)
    progress(1, 5, "growth (cpu)")
    progress.close()
    assert stream.getvalue() == ""


def test_schema_check_rejects_a_bound_that_is_not_a_number():
    row = dict(ROWS[1], bound="1e-5")
    with pytest.raises(ValueError, match="'bound' is not a number"):
        validate_report({"version": 1, "environment": {}, "summary": {}, "rows": [row]})


def test_a_diverged_row_with_a_short_subject_trace_still_gets_its_panels(tmp_path):
    series = {
        "scales_reference": [8.0, 4.0, 4.0],
        "scales_subject": [8.0, 8.0],
        "skipped_reference": [False, True, False],
        "skipped_subject": [False, False],
        "losses_reference": [1.0, math.inf, 0.5],
        "losses_subject": [1.0, 2.0],
    }
    row = _row(
        "forced_overflow",
        "exact",
        "diverged",
        "scale/skip sequences differ; first difference at step 1",
        0.5,
        series=series,
        first_divergence=1,
    )
    write_reports(tmp_path, [row], ENVIRONMENT, "roundpipe-parity")
    figure = (tmp_path / "report.html").read_text(encoding="utf-8").split('id="plot-0"')[1]
    assert figure.count("<svg") == 4  # scale, its difference, loss, its difference
    assert "skip differs" in figure and "one side not finite" in figure


def test_a_title_too_long_for_the_panel_is_squeezed_to_fit():
    short, long = diff_panel("loss", [0.5]), diff_panel("a title of well over eighty characters " * 3, [0.5])
    assert "textLength" not in short and 'textLength="562" lengthAdjust="spacingAndGlyphs"' in long


def test_export_plots_writes_each_panel_as_a_standalone_svg_with_axes(written, tmp_path, capsys):
    out = tmp_path / "plots"
    assert export_plots.main([str(written / "report.json"), str(out)]) == 0
    names = sorted(path.name for path in out.iterdir())
    assert names == sorted(
        [
            "cpu-clean-dropin-scale.svg",
            "cpu-clean-dropin-loss.svg",  # bitwise: no diff panels
            "cpu-microbatches-exact-scale.svg",
            "cpu-microbatches-exact-loss.svg",
            "cpu-microbatches-exact-loss-diff.svg",
        ]
    )  # the skipped row has none
    svg = "{http://www.w3.org/2000/svg}"
    for name in names:
        root = ET.fromstring((out / name).read_bytes())  # well-formed XML, an <svg> at the root
        assert root.tag == f"{svg}svg" and (root.get("width"), root.get("height")) == ("640", "260")
        texts = [t.text for t in root.iter(f"{svg}text")]
        assert "optimizer step" in texts and "3" in texts, "the step axis, labelled and ticked"
        assert root.find(f"{svg}title").text.startswith(name.split("-")[1] + ", ")
    diff = (out / "cpu-microbatches-exact-loss-diff.svg").read_text(encoding="utf-8")
    assert "bound 1e-05" in diff and ">1e-7</text>" in diff
    assert "wrote 5 SVG file(s)" in capsys.readouterr().err


def test_export_plots_writes_only_the_panels_named(written, tmp_path):
    out = tmp_path / "plots"
    assert export_plots.main([str(written / "report.json"), str(out), "--panel", "cpu-clean-dropin-loss"]) == 0
    assert [path.name for path in out.iterdir()] == ["cpu-clean-dropin-loss.svg"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--panel", "cpu-clean-exact-loss"], "no panel named cpu-clean-exact-loss"),
        ([], "not-there.json"),
    ],
)
def test_export_plots_rejects_an_unknown_panel_or_report(written, tmp_path, capsys, args, message):
    report = written / ("report.json" if args else "not-there.json")
    with pytest.raises(SystemExit) as exit_info:
        export_plots.main([str(report), str(tmp_path / "plots")] + args)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "plots").exists()
