"""The ``roundpipe-migrate`` command line: file discovery, modes, output, exit statuses.

Most tests swap the engine for ``fake_engine.fake_migrate`` (the real one changes
nothing yet): a source containing ``GradScaler`` gets ``# migrated`` appended,
``DataParallel`` makes it partial, ``NOTE`` adds an info diagnostic. A few tests run the
real engine.
"""

import io
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from fake_engine import (
    crashing_migrate,
    fake_migrate,
    misplaced_return_migrate,
    rewriting_migrate,
    uncompilable_migrate,
)
from migrate import cli
from migrate_cli_support import AMP, REPO, SUBPROCESS_ENV, run

MIGRATED = AMP + "# migrated\n"
PARTIAL = AMP + "m = DataParallel(m)\n"
NOTED = AMP + "# NOTE\n"
PLAIN = "x = 1\n"
LATIN1 = b"s = 'caf\xe9'\n"
RPM101_TEXT = "RPM101 model wrapped in DistributedDataParallel/DataParallel"


@pytest.fixture
def fake(monkeypatch):
    """Use the fake engine for the test."""
    monkeypatch.setattr(cli, "ENGINE", fake_migrate)


def summary(files, migrated, partial, errors, unchanged, dry=True):
    """The summary line the tool prints for these counts: in the modes that write nothing
    (``dry``), changed files "would migrate"."""
    done = "would migrate" if dry else "migrated"
    return (
        f"roundpipe-migrate: {files} file{'s' * (files != 1)} checked, {migrated} {done}, "
        f"{partial} partial, {errors} error{'s' * (errors != 1)}, {unchanged} unchanged"
    )


def make(root, files):
    """Create ``files`` ({relative path: text or bytes}) under ``root``; return ``root``."""
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8", newline="")
    return root


def snapshot(root):
    """{relative path: bytes} of every file below ``root``."""
    files = sorted(p for p in root.rglob("*") if p.is_file())
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in files}


def statuses(report_path):
    """{path: status} from a --report file, in report order."""
    entries = json.loads(report_path.read_text())["files"]
    return {entry["path"]: entry["status"] for entry in entries}


# ------------------------------------------------------------------ process level


def test_cli_does_not_import_torch_or_roundpipe():
    code = "import migrate.cli, sys; assert not {'torch', 'roundpipe'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=SUBPROCESS_ENV, check=True)


def test_python_dash_m_migrate_runs_the_tool(tmp_path):
    (tmp_path / "a.py").write_text(PLAIN)
    done = subprocess.run(
        [sys.executable, "-m", "migrate", str(tmp_path)],
        cwd=REPO,
        env=SUBPROCESS_ENV,
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", summary(1, 0, 0, 0, 1) + "\n")


def test_help_exits_zero(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    assert out.startswith("usage: roundpipe-migrate")


@pytest.mark.parametrize(
    "argv",
    [
        ["-w", "-o", "out", "x.py"],
        ["-w", "--check", "x.py"],
        ["-q", "-v", "x.py"],
        ["-j", "0", "x.py"],
        ["-j", "many", "x.py"],
        [],
        ["-", "x.py"],
        ["-w", "-"],
    ],
)
def test_usage_errors_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert "usage: roundpipe-migrate" in err


# ----------------------------------------------------------------- the real engine


def test_real_engine_leaves_a_file_without_amp_unchanged(tmp_path, capsys):
    make(tmp_path, {"plain.py": "import torch\nprint(torch.ones(1))\n"})
    code, out, err = run(capsys, "-v", tmp_path)
    assert (code, out) == (0, "")
    assert err.splitlines() == [f"{tmp_path / 'plain.py'}: unchanged", summary(1, 0, 0, 0, 1)]


def test_real_engine_syntax_error_is_rpm901_and_other_files_still_run(tmp_path, capsys):
    broken = "from torch.amp import GradScaler\ndef broken(:\n"
    make(tmp_path, {"a_broken.py": broken, "b_fine.py": PLAIN})
    code, out, err = run(capsys, "--report", tmp_path / "r.json", tmp_path)
    assert (code, out) == (2, "")
    assert err.startswith(f"{tmp_path / 'a_broken.py'}:2:")
    assert " RPM901 " in err
    assert err.endswith(summary(2, 0, 0, 1, 1) + "\n")
    assert statuses(tmp_path / "r.json") == {
        str(tmp_path / "a_broken.py"): "error",
        str(tmp_path / "b_fine.py"): "unchanged",
    }


# ---------------------------------------------------------------------- the modes


def test_default_prints_a_diff_and_writes_nothing(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP, "b.py": PLAIN})
    before = snapshot(tmp_path)
    code, out, err = run(capsys, tmp_path)
    assert code == 0
    name = (tmp_path / "a.py").as_posix()
    assert out.splitlines() == [
        f"--- a/{name}",
        f"+++ b/{name}",
        "@@ -1,2 +1,3 @@",
        " from torch.amp import GradScaler",
        " scaler = GradScaler()",
        "+# migrated",
    ]
    assert snapshot(tmp_path) == before
    assert err == summary(2, 1, 0, 0, 1) + "\n"


def test_diff_marks_a_missing_final_newline(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": "s = GradScaler()"})
    _, out, _ = run(capsys, tmp_path / "a.py")
    assert out.splitlines()[3:] == [
        "-s = GradScaler()",
        "\\ No newline at end of file",
        "+s = GradScaler()# migrated",
    ]


def test_check_names_each_file_that_would_change_exits_1_and_writes_nothing(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP, "b.py": PLAIN, "c.py": AMP})
    before = snapshot(tmp_path)
    assert run(capsys, "--check", tmp_path) == (
        1,
        "",
        "\n".join(
            [
                f"would migrate {tmp_path / 'a.py'}",
                f"would migrate {tmp_path / 'c.py'}",
                summary(3, 2, 0, 0, 1),
            ]
        )
        + "\n",
    )
    assert run(capsys, "-q", "--check", tmp_path) == (1, "", "")
    assert snapshot(tmp_path) == before
    assert run(capsys, "--check", tmp_path / "b.py")[0] == 0
    code, out, _ = run(capsys, "--check", "--diff", tmp_path)
    assert code == 1 and "+# migrated" in out


def test_write_rewrites_changed_files_only(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP, "b.py": PLAIN})
    assert run(capsys, "-w", tmp_path)[:2] == (0, "")
    assert snapshot(tmp_path) == {"a.py": MIGRATED.encode(), "b.py": PLAIN.encode()}
    code, out, _ = run(capsys, "-w", "--diff", tmp_path)
    assert code == 0 and out.count("+# migrated") == 1


def test_write_keeps_permissions_and_crlf(tmp_path, capsys, fake):
    original = b"from torch.amp import GradScaler\r\nscaler = GradScaler()\r\n"
    path = make(tmp_path, {"a.py": original}) / "a.py"
    path.chmod(0o750)
    assert run(capsys, "-w", path)[0] == 0
    assert path.read_bytes() == original + b"# migrated\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o750
    assert os.listdir(tmp_path) == ["a.py"]


def test_write_through_a_symlink_updates_the_target(tmp_path, capsys, fake):
    real = make(tmp_path, {"real.py": AMP}) / "real.py"
    (tmp_path / "link.py").symlink_to(real)
    assert run(capsys, "-w", tmp_path / "link.py")[0] == 0
    assert (tmp_path / "link.py").is_symlink()
    assert real.read_text() == MIGRATED


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_write_failure_leaves_the_original_intact(tmp_path, capsys, fake, monkeypatch, failing):
    """The first write (a.py) fails mid-way; b.py is still written."""
    make(tmp_path, {"a.py": AMP, "b.py": "s = GradScaler()\n"})
    real = getattr(os, failing)
    calls = []

    def fail_the_first_call(*args):
        calls.append(args)
        if len(calls) == 1:
            raise OSError(28, "No space left on device")
        return real(*args)

    monkeypatch.setattr(os, failing, fail_the_first_call)
    code, _, err = run(capsys, "-w", tmp_path)
    assert code == 2
    assert (tmp_path / "a.py").read_bytes() == AMP.encode()
    assert (tmp_path / "b.py").read_text() == "s = GradScaler()\n# migrated\n"
    assert sorted(os.listdir(tmp_path)) == ["a.py", "b.py"]
    assert err.splitlines() == [
        f"{tmp_path / 'a.py'}:1:1: RPM902 migrated text could not be written to "
        f"{tmp_path / 'a.py'} (No space left on device); file left unchanged",
        summary(2, 1, 0, 1, 0, dry=False),
    ]


@pytest.mark.parametrize("engine", [uncompilable_migrate, misplaced_return_migrate])
def test_uncompilable_output_is_never_written(tmp_path, capsys, monkeypatch, engine):
    monkeypatch.setattr(cli, "ENGINE", engine)
    make(tmp_path, {"a.py": AMP})
    code, out, err = run(capsys, "-w", "--report", tmp_path / "r.json", tmp_path / "a.py")
    assert (code, out) == (2, "")
    assert (tmp_path / "a.py").read_text() == AMP
    assert err.splitlines()[0] == (
        f"{tmp_path / 'a.py'}:1:1: RPM904 internal error: the migrated text does not compile; "
        "file left unchanged (please report this)"
    )
    assert json.loads((tmp_path / "r.json").read_text())["files"][0]["changed"] is False


def test_an_engine_crash_is_an_error_for_that_file_only(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "ENGINE", crashing_migrate)
    make(tmp_path, {"a.py": AMP, "b.py": PLAIN})
    code, _, err = run(capsys, tmp_path)
    assert code == 2
    assert err.splitlines() == [
        f"{tmp_path / 'a.py'}:1:1: RPM904 internal error: migration failed "
        "(RuntimeError: engine bug); "
        "file left unchanged (please report this)",
        summary(2, 0, 0, 1, 1),
    ]


def test_output_dir_mirrors_changed_files_and_leaves_originals(tmp_path, capsys, fake):
    src = make(tmp_path / "src", {"top.py": AMP, "pkg/sub/deep.py": AMP, "pkg/plain.py": PLAIN})
    make(tmp_path, {"loose.py": AMP})
    before = snapshot(tmp_path)
    out_dir = tmp_path / "out"
    assert run(capsys, "-o", out_dir, src, tmp_path / "loose.py")[:2] == (0, "")
    assert snapshot(tmp_path) == {
        **before,
        "out/top.py": MIGRATED.encode(),
        "out/pkg/sub/deep.py": MIGRATED.encode(),
        "out/loose.py": MIGRATED.encode(),
    }


def test_output_dir_inside_the_tree_is_not_searched(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP, "migrated/old.py": AMP})
    code, _, err = run(capsys, "-v", "-o", tmp_path / "migrated", tmp_path)
    assert code == 0
    assert "old.py" not in err
    assert snapshot(tmp_path / "migrated") == {"a.py": MIGRATED.encode(), "old.py": AMP.encode()}


@pytest.mark.parametrize(
    ("paths", "message"),
    [(["one", "two"], "-o would write both"), (["one"], "itself")],
)
def test_output_dir_refuses_to_overwrite_anything(tmp_path, capsys, fake, paths, message):
    make(tmp_path, {"one/a.py": AMP, "two/a.py": AMP})
    before = snapshot(tmp_path)
    output = tmp_path / "out" if len(paths) == 2 else tmp_path / "one"
    code, _, err = run(capsys, "-o", output, *(tmp_path / path for path in paths))
    assert code == 2
    assert message in err
    assert snapshot(tmp_path) == before


def test_stdin_to_stdout_keeps_bytes_exact(capsysbinary, monkeypatch, fake):
    source = b"from torch.amp import GradScaler\r\ns = GradScaler()\r\n"
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source)))
    assert cli.main(["-"]) == 0
    captured = capsysbinary.readouterr()
    assert captured.out == source + b"# migrated\n"
    assert captured.err == (summary(1, 1, 0, 0, 0, dry=False) + "\n").encode()


def test_stdin_replaced_by_a_text_stream(capsys, monkeypatch, fake):
    monkeypatch.setattr(sys, "stdin", io.StringIO(AMP))
    assert run(capsys, "-") == (0, MIGRATED, summary(1, 1, 0, 0, 0, dry=False) + "\n")


def test_stdin_diff_diagnostics_and_exit_status(capsysbinary, monkeypatch, fake):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(PARTIAL.encode())))
    assert cli.main(["-", "--diff"]) == 1
    captured = capsysbinary.readouterr()
    assert captured.out.startswith(b"--- a/<stdin>\n+++ b/<stdin>\n")
    assert captured.err.startswith(f"<stdin>:1:1: {RPM101_TEXT}\n".encode())


def test_stdin_that_is_not_utf8(capsysbinary, monkeypatch, fake):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LATIN1)))
    assert cli.main(["-"]) == 2
    captured = capsysbinary.readouterr()
    assert captured.out == b""
    assert captured.err.startswith(b"<stdin>:1:9: RPM903 file is not UTF-8")


def test_exact_reaches_the_engine(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP})
    assert "+# migrated exact" in run(capsys, "--exact", tmp_path)[1]


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_apex_target_reaches_the_engine_in_every_worker(tmp_path, capsys, fake, jobs):
    make(tmp_path, {"a.py": AMP, "b.py": AMP})
    out = run(capsys, "-j", jobs, "--apex-target", "plain", "--exact", tmp_path)[1]
    assert out.count("+# migrated exact for plain") == 2


def test_apex_target_reaches_the_engine_from_stdin(capsys, monkeypatch, fake):
    monkeypatch.setattr(sys, "stdin", io.StringIO(AMP))
    assert run(capsys, "--apex-target", "plain", "-")[1] == AMP + "# migrated for plain\n"


# ---------------------------------------------------------- diagnostics and status


def test_partial_exits_1_and_info_does_not(tmp_path, capsys, fake):
    make(tmp_path, {"dp.py": PARTIAL, "note.py": NOTED})
    code, _, err = run(capsys, "-v", tmp_path)
    assert code == 1
    assert err.splitlines() == [
        f"{tmp_path / 'dp.py'}:1:1: {RPM101_TEXT}",
        f"{tmp_path / 'dp.py'}: partial",
        f"{tmp_path / 'note.py'}:1:1: RPM301 a note on the migrated code",
        f"{tmp_path / 'note.py'}: would migrate",
        summary(2, 1, 1, 0, 0),
    ]
    assert run(capsys, tmp_path / "note.py")[0] == 0


def test_quiet_hides_info_and_summary_only(tmp_path, capsys, fake):
    make(tmp_path, {"dp.py": PARTIAL, "note.py": NOTED})
    code, _, err = run(capsys, "-q", tmp_path)
    assert code == 1
    assert err == f"{tmp_path / 'dp.py'}:1:1: {RPM101_TEXT}\n"


def test_partial_and_error_together_exit_2(tmp_path, capsys, fake):
    make(tmp_path, {"dp.py": PARTIAL, "latin.py": LATIN1})
    assert run(capsys, tmp_path)[0] == 2


def test_not_utf8_points_at_the_first_bad_byte(tmp_path, capsys):
    make(tmp_path, {"a.py": b"x = 1\r\ny = '\xc3\xa9'\r\nz = '\xc3('\n"})
    code, _, err = run(capsys, tmp_path / "a.py")
    assert code == 2
    assert err.splitlines()[0] == (
        f"{tmp_path / 'a.py'}:3:6: RPM903 file is not UTF-8 (invalid continuation byte); file skipped"
    )


def test_unreadable_and_non_utf8_files_do_not_stop_the_run(tmp_path, capsys, fake, monkeypatch):
    make(tmp_path, {"a.py": AMP, "b_locked.py": AMP, "c_latin.py": LATIN1, "d.py": AMP})
    real_open = os.open

    def locked_open(path, *args, **kwargs):
        if os.fspath(path).endswith("b_locked.py"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", locked_open)
    code, out, err = run(capsys, tmp_path, tmp_path / "missing.py")
    assert code == 2
    assert out.count("+# migrated") == 2
    assert err.splitlines() == [
        f"{tmp_path / 'b_locked.py'}:1:1: RPM902 file could not be read: Permission denied",
        f"{tmp_path / 'c_latin.py'}:1:9: RPM903 file is not UTF-8 (invalid continuation byte); file skipped",
        f"{tmp_path / 'missing.py'}:1:1: RPM902 file could not be read: No such file or directory",
        summary(5, 2, 0, 3, 0),
    ]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can read a mode-000 file")
def test_mode_000_file_is_rpm902(tmp_path, capsys, fake):
    path = make(tmp_path, {"a.py": AMP}) / "a.py"
    path.chmod(0)
    try:
        code, _, err = run(capsys, path)
    finally:
        path.chmod(0o644)
    assert code == 2
    assert f"{path}:1:1: RPM902 file could not be read: Permission denied" in err


def test_folder_that_cannot_be_listed_is_rpm902(tmp_path, capsys, fake, monkeypatch):
    make(tmp_path, {"a.py": AMP, "gone/b.py": AMP})
    real_scandir = os.scandir

    def scandir(path="."):
        if os.fspath(path).endswith("gone"):
            raise FileNotFoundError(2, "No such file or directory", os.fspath(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, out, err = run(capsys, tmp_path)
    assert code == 2
    assert out.count("+# migrated") == 1
    assert err.splitlines() == [
        f"{tmp_path / 'gone'}:1:1: RPM902 file could not be read: No such file or directory",
        summary(2, 1, 0, 1, 0),
    ]


# ------------------------------------------------------------------- discovery


def test_skipped_folders_and_excludes(tmp_path, capsys, fake):
    make(
        tmp_path,
        {
            "keep.py": PLAIN,
            "notes.txt": PLAIN,
            ".hidden/x.py": PLAIN,
            "venv/x.py": PLAIN,
            "env/pyvenv.cfg": "",
            "env/x.py": PLAIN,
            "myenv/pyvenv.cfg": "",
            "myenv/lib/x.py": PLAIN,
            "envs/x.py": PLAIN,
            "pkg/__pycache__/x.py": PLAIN,
            "lib/site-packages/x.py": PLAIN,
            "build/x.py": PLAIN,
            "pkg/gen/x.py": PLAIN,
            "pkg/model_pb2.py": PLAIN,
            "pkg/model.py": PLAIN,
        },
    )
    report = tmp_path / "r.json"
    excludes = ["--exclude", "build", "--exclude", "pkg/gen/*", "--exclude", "*_pb2.py"]
    assert run(capsys, "--report", report, *excludes, tmp_path)[0] == 0
    kept = ["envs/x.py", "keep.py", "pkg/model.py"]
    assert list(statuses(report)) == [str(tmp_path / rel) for rel in kept]


def test_files_are_sorted_and_explicit_paths_kept_whatever_their_name(tmp_path, capsys, fake):
    tree = make(tmp_path / ".tree", {"b.py": PLAIN, "a/z.py": PLAIN, "a.py": PLAIN, "c.py": PLAIN})
    make(tmp_path, {"script": AMP})
    report = tmp_path / "r.json"
    code, out, _ = run(capsys, "--report", report, tmp_path / "script", tree, tree / "c.py")
    assert code == 0 and "+# migrated" in out
    expected = [tmp_path / "script", *(tree / rel for rel in ["a/z.py", "a.py", "b.py", "c.py"])]
    assert list(statuses(report)) == [str(path) for path in expected]


def test_two_thousand_files_are_quick(tmp_path, capsys, fake):
    make(tmp_path, {f"d{i % 20}/f{i}.py": f"x = {i}\n" for i in range(2000)})
    make(tmp_path, {f"d0/f{i}.py": AMP for i in range(0, 2000, 100)})
    start = time.monotonic()
    code, out, err = run(capsys, "--check", tmp_path)
    assert time.monotonic() - start < 10
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == summary(2000, 20, 0, 0, 1980)
    assert err.count("would migrate /") == 20


# ----------------------------------------------------------------- report and -j


def test_report_contents(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": AMP, "b.py": PLAIN, "c.py": PARTIAL, "d.py": b"\xff\n"})
    report = tmp_path / "out" / "r.json"
    report.parent.mkdir()
    assert run(capsys, "--report", report, tmp_path)[0] == 2
    data = json.loads(report.read_text())
    assert (data["version"], data["mode"], data["output"]) == (2, "diff", None)
    assert data["summary"] == {"files": 4, "changed": 2, "migrated": 1, "partial": 1, "error": 1, "unchanged": 1}
    a, b, c, d = data["files"]
    assert a == {
        "path": str(tmp_path / "a.py"),
        "status": "migrated",
        "changed": True,
        "rewrites": [{"line": 1, "description": "marked as migrated"}],
        "diagnostics": [],
        "changes": [
            {
                "kind": "inserted",
                "original": {"start": 3, "count": 0},
                "new": {"start": 3, "count": 1},
                "source": "diff",
            }
        ],
    }
    assert b == {
        "path": str(tmp_path / "b.py"),
        "status": "unchanged",
        "changed": False,
        "rewrites": [],
        "diagnostics": [],
        "changes": [],
    }
    assert (c["status"], c["changed"], c["diagnostics"][0]["code"]) == ("partial", True, "RPM101")
    assert (d["status"], d["changed"], d["diagnostics"][0]["code"]) == ("error", False, "RPM903")


@pytest.mark.parametrize(
    ("flags", "mode", "output"),
    [
        (["--check"], "check", None),
        (["-w"], "write", "in place"),
        (["-o", "{tmp}/mirror"], "output", "{tmp}/mirror"),
    ],
)
def test_report_records_the_mode_and_where_output_went(tmp_path, capsys, fake, flags, mode, output):
    make(tmp_path, {"src/a.py": AMP})
    report = tmp_path / "r.json"
    flags = [flag.format(tmp=tmp_path) for flag in flags]
    run(capsys, "--report", report, *flags, tmp_path / "src")
    data = json.loads(report.read_text())
    assert (data["mode"], data["output"]) == (mode, output and output.format(tmp=tmp_path))


def test_report_labels_replaced_and_removed_lines_with_both_numberings(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "ENGINE", rewriting_migrate)
    make(tmp_path, {"a.py": "import torch\nscaler = GradScaler()\nx = 1\ny = 2\nz = 3\n"})
    report = tmp_path / "r.json"
    run(capsys, "--report", report, tmp_path / "a.py")
    assert json.loads(report.read_text())["files"][0]["changes"] == [
        {"kind": "removed", "original": {"start": 1, "count": 1}, "new": {"start": 1, "count": 0}, "source": "diff"},
        {"kind": "replaced", "original": {"start": 4, "count": 1}, "new": {"start": 3, "count": 2}, "source": "diff"},
    ]


def test_report_that_cannot_be_written_exits_2(tmp_path, capsys, fake):
    make(tmp_path, {"a.py": PLAIN})
    code, _, err = run(capsys, "--report", tmp_path / "no" / "r.json", tmp_path / "a.py")
    assert code == 2
    assert err.startswith(f"roundpipe-migrate: error: report could not be written to {tmp_path}")


def test_two_workers_give_the_same_output_as_one(tmp_path, capsys, fake):
    files = {f"p{i % 3}/f{i:02d}.py": AMP if i % 4 == 0 else PLAIN for i in range(40)}
    files.update({"p0/dp.py": PARTIAL, "p1/bad.py": b"\xff", "p2/note.py": NOTED})
    make(tmp_path / "src", files)
    outputs = []
    for jobs in ("1", "2"):
        report = tmp_path / f"r{jobs}.json"
        result = run(capsys, "-v", "--exact", "-j", jobs, "--report", report, tmp_path / "src")
        outputs.append((result, report.read_text()))
    assert outputs[0] == outputs[1]
    (code, out, err), _ = outputs[0]
    assert code == 2 and out.count("+# migrated exact") == 12
    assert err.endswith(summary(43, 11, 1, 1, 30) + "\n")
