"""roundpipe-migrate under hostile input and hostile conditions (issue 11).

Input that crashes parsers, files that are not files, writes that would lose what the
user had, and runs that are killed or interrupted. Anything that could take the process
down or hang runs in a subprocess with a timeout.
"""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fake_engine import dying_migrate, fake_migrate
from migrate import cli
from migrate_cli_support import AMP, REPO, run
from migrate_cli_support import SUBPROCESS_ENV as ENV

BASIC = (REPO / "examples" / "amp_basic.py").read_text()
SCALER = AMP
BOM = "\ufeff".encode()


@pytest.fixture
def fake(monkeypatch):
    """Use the fake engine for the test."""
    monkeypatch.setattr(cli, "ENGINE", fake_migrate)


def tool(*argv, timeout=60, **kwargs):
    """Run ``python -m migrate`` in a subprocess; the completed process."""
    return subprocess.run(
        [sys.executable, "-m", "migrate", *map(str, argv)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


def summary_of(err):
    return err.strip().splitlines()[-1]


# ----------------------------------------------------------------- input that bites


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize(
    "deep",
    [
        "x = " + "(" * 2000 + "1" + ")" * 2000,  # refused by Python's parser
        "x = " + "a and " * 10000 + "1",  # accepted by Python, 8 MiB of native stack for libcst
    ],
    ids=["2000-brackets", "10000-and"],
)
def test_deeply_nested_file_gets_a_diagnostic_and_the_run_goes_on(tmp_path, jobs, deep):
    (tmp_path / "a_deep.py").write_text(SCALER + deep + "\n")
    for name in ("b_train.py", "c_train.py", "d_train.py"):
        (tmp_path / name).write_text(BASIC)
    done = tool("-j", jobs, "--report", tmp_path / "r.json", tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"{tmp_path / 'a_deep.py'}:" in done.stderr and " RPM901 " in done.stderr
    assert "Traceback" not in done.stderr
    assert summary_of(done.stderr) == (
        "roundpipe-migrate: 4 files checked, 3 would migrate, 0 partial, 1 error, 0 unchanged"
    )
    assert done.stdout.count("+++ b/") == 3
    report = json.loads((tmp_path / "r.json").read_text())
    assert [entry["status"] for entry in report["files"]] == ["error"] + ["migrated"] * 3


@pytest.mark.parametrize(
    "body",
    [
        "x = " + "[" * 201 + "1" + "]" * 201,
        "x = " + "-" * 500 + "1",
        "x = 1\x00\n",
        "print 'hello'",
        "exec 'x = 1'",
    ],
    ids=["201-deep-list", "500-deep-unary", "nul-byte", "python2-print", "python2-exec"],
)
def test_deep_nul_and_python2_input_is_a_user_error_not_an_internal_one(tmp_path, capsys, body):
    path = tmp_path / "a.py"
    path.write_text(SCALER + body + "\n")
    code, out, err = run(capsys, "-w", path)
    assert (code, out) == (2, "")
    first = err.splitlines()[0]
    assert first.startswith(f"{path}:") and " RPM901 " in first, err
    assert "internal" not in err and "please report" not in err
    assert path.read_text() == SCALER + body + "\n"


def test_the_deepest_list_python_accepts_is_migrated_around(tmp_path, capsys):
    """200 nested brackets (Python's limit; 201 is the syntax error above): the engine walks
    such a file without running out of stack, so the training code in it is migrated and the
    deep line stays as it was."""
    deep = "x = " + "[" * 200 + "1" + "]" * 200
    path = tmp_path / "a.py"
    path.write_text(SCALER + deep + "\n")
    code, out, err = run(capsys, "-w", path)
    assert (code, out) == (0, ""), err
    migrated = path.read_text()
    assert "roundpipe" in migrated and deep in migrated.splitlines()
    compile(migrated, str(path), "exec")


def test_syntax_errors_are_reported_in_files_without_any_amp_marker(tmp_path, capsys):
    (tmp_path / "plain_broken.py").write_text("def f(:\n    pass\n")
    (tmp_path / "plain_fine.py").write_text("x = 1\n")
    code, out, err = run(capsys, tmp_path)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == (
        f"{tmp_path / 'plain_broken.py'}:1:7: RPM901 syntax error, file skipped: invalid syntax"
    )


def test_a_walrus_bound_scaler_is_refused_with_a_diagnostic_not_an_internal_error(tmp_path, capsys):
    source = "import torch\nif (scaler := torch.amp.GradScaler()):\n    pass\n"
    path = tmp_path / "walrus.py"
    path.write_text(source)
    (tmp_path / "z_train.py").write_text(BASIC)
    code, out, err = run(capsys, "--report", tmp_path / "r.json", tmp_path)
    statuses = [entry["status"] for entry in json.loads((tmp_path / "r.json").read_text())["files"]]
    assert statuses[1] == "migrated" and "+++ b/" in out  # the run went on
    assert statuses[0] == "partial" and f"{path}:2:15: RPM105" in err and "RPM904" not in err
    assert code == 1
    assert path.read_text() == source


# --------------------------------------------------------------- what -w must keep


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file another owner needs root")
def test_write_keeps_owner_group_and_mode(tmp_path, capsys, fake):
    path = tmp_path / "a.py"
    path.write_text(AMP)
    os.chown(path, 4321, 8765)
    path.chmod(0o640)
    assert run(capsys, "-w", path)[0] == 0
    info = path.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (4321, 8765, 0o640)
    assert path.read_text() == AMP + "# migrated\n"


def test_write_in_place_when_the_owner_cannot_be_kept(tmp_path, capsys, fake, monkeypatch):
    path = tmp_path / "a.py"
    path.write_text(AMP)
    inode = path.stat().st_ino

    def not_permitted(*args):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "fchown", not_permitted)
    monkeypatch.setattr(os, "fstat", lambda fd, real=os.fstat: _other_owner(real(fd)))
    assert run(capsys, "-w", path)[0] == 0
    assert path.stat().st_ino == inode  # the same file, so its owner stayed
    assert path.read_text() == AMP + "# migrated\n"
    assert os.listdir(tmp_path) == ["a.py"]


def _other_owner(info):
    """``info`` as if the file belonged to someone else (the temporary file does not)."""
    values = list(info)
    values[stat.ST_UID] = info.st_uid + 1
    return os.stat_result(values)


def test_write_keeps_hard_links(tmp_path, capsys, fake):
    path = tmp_path / "tree" / "a.py"
    path.parent.mkdir()
    path.write_text(AMP)
    other = tmp_path / "elsewhere.py"
    os.link(path, other)
    assert run(capsys, "-w", tmp_path / "tree")[0] == 0
    assert os.path.samefile(path, other) and path.stat().st_nlink == 2
    assert other.read_text() == AMP + "# migrated\n"


def test_write_refuses_a_read_only_file(tmp_path, capsys, fake):
    path = tmp_path / "a.py"
    path.write_text(AMP)
    path.chmod(0o444)
    inode = path.stat().st_ino
    code, _, err = run(capsys, "-w", path)
    assert code == 2
    assert err.splitlines()[0] == (
        f"{path}:1:1: RPM902 not written: the file is read-only; make it writable to migrate it"
    )
    assert path.read_text() == AMP
    assert (path.stat().st_ino, stat.S_IMODE(path.stat().st_mode)) == (inode, 0o444)


def test_write_keeps_a_bom(tmp_path, capsys):
    plain, with_bom = tmp_path / "plain.py", tmp_path / "bom.py"
    plain.write_text(BASIC)
    with_bom.write_bytes(BOM + BASIC.encode())
    assert run(capsys, "-w", plain, with_bom)[0] == 0
    assert plain.read_text() != BASIC
    assert with_bom.read_bytes() == BOM + plain.read_bytes()


def test_stdin_keeps_a_bom(tmp_path):
    plain = tool("-", input=BASIC)
    with_bom = subprocess.run(
        [sys.executable, "-m", "migrate", "-"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        input=BOM + BASIC.encode(),
        timeout=60,
    )
    assert plain.returncode == with_bom.returncode == 0
    assert with_bom.stdout == BOM + plain.stdout.encode()


def test_stdin_that_is_not_utf8_gets_the_same_diagnostic_as_a_file(tmp_path):
    data = b"s = 'caf\xe9'\nscaler = GradScaler()\n"
    (tmp_path / "latin.py").write_bytes(data)
    from_file = tool(tmp_path / "latin.py")
    from_stdin = subprocess.run(
        [sys.executable, "-m", "migrate", "--diff", "-"],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        input=data,
        timeout=60,
    )
    assert from_stdin.returncode == from_file.returncode == 2
    assert from_stdin.stdout == b""
    assert from_stdin.stderr.decode().replace("<stdin>", str(tmp_path / "latin.py")) == from_file.stderr


@pytest.mark.parametrize(
    "imports",
    [
        "try:\n    from torch.amp import GradScaler  # new spelling\n"
        "except ImportError:\n    from torch.cuda.amp import GradScaler  # old spelling\n",
        "if True:\n    from torch.cuda.amp import GradScaler  # the sole line\n",
    ],
    ids=["except-branch", "sole-import"],
)
def test_write_keeps_the_comment_of_a_rewritten_import_line(tmp_path, capsys, imports):
    source = BASIC.replace("import torch.nn as nn\n", "import torch.nn as nn\n" + imports, 1)
    source = source.replace("torch.amp.GradScaler(device)", "GradScaler(init_scale=2.0**16)")
    assert imports in source and "GradScaler(init_scale" in source
    path = tmp_path / "a.py"
    path.write_text(source)
    assert run(capsys, "-w", path)[0] == 0
    migrated = path.read_text()
    assert migrated != source
    for comment in ("# new spelling", "# old spelling", "# the sole line"):
        assert (comment in source) <= (comment in migrated), comment


def test_write_on_a_folder_never_writes_through_a_symlink_that_leads_out(tmp_path, capsys, fake):
    outside = tmp_path / "outside.py"
    outside.write_text(AMP)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "inside.py").write_text(AMP)
    (tree / "link_out.py").symlink_to(outside)
    (tree / "link_in.py").symlink_to(tree / "inside.py")
    (tmp_path / "outside_dir").mkdir()
    (tmp_path / "outside_dir" / "far.py").write_text(AMP)
    (tree / "linked_dir").symlink_to(tmp_path / "outside_dir")
    code, _, err = run(capsys, "-w", tree)
    assert code == 2
    assert outside.read_text() == AMP
    assert (tmp_path / "outside_dir" / "far.py").read_text() == AMP  # not entered
    assert (tree / "inside.py").read_text() == AMP + "# migrated\n"
    assert (tree / "link_out.py").is_symlink() and (tree / "link_in.py").is_symlink()
    assert err.splitlines()[0] == (
        f"{tree / 'link_out.py'}:1:1: RPM902 not written: {tree / 'link_out.py'} is a symlink "
        f"to {outside}, outside the folders given; name the link or its target directly to "
        "rewrite it"
    )
    assert summary_of(err).startswith("roundpipe-migrate: 2 files checked")  # link_in: once


# ------------------------------------------------------------ what is not a file


@pytest.mark.timeout(30)
def test_fifos_and_devices_are_skipped_unread(tmp_path, capsys, fake):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "tree").mkdir()
    os.mkfifo(tmp_path / "tree" / "found.py")
    (tmp_path / "tree" / "real.py").write_text(AMP)
    code, out, err = run(capsys, tmp_path / "pipe.py", "/dev/null", tmp_path / "tree")
    assert code == 2 and out.count("+++ b/") == 1
    assert err.splitlines()[:3] == [
        f"{tmp_path / 'pipe.py'}:1:1: RPM905 not a regular file (a FIFO); file skipped, never read",
        "/dev/null:1:1: RPM905 not a regular file (a character device); file skipped, never read",
        f"{tmp_path / 'tree' / 'found.py'}:1:1: RPM905 not a regular file (a FIFO); file skipped, never read",
    ]


def test_a_notebook_given_by_name_is_reported_as_not_supported(tmp_path, capsys, fake):
    path = tmp_path / "train.ipynb"
    path.write_text(json.dumps({"cells": [{"source": ["scaler = GradScaler()"]}]}))
    code, out, err = run(capsys, path)
    assert (code, out) == (2, "")
    assert err.splitlines()[0] == (
        f"{path}:1:1: RPM905 Jupyter notebooks are not supported; export the notebook as a "
        "script (jupyter nbconvert --to script) and migrate that; file skipped"
    )


# ------------------------------------------------------------ killed, interrupted


def _slow_tree(root, files=40):
    root.mkdir()
    for i in range(files):
        (root / f"train_{i:02d}.py").write_text(BASIC + f"\nRUN = {i}\n")
    return root


def _children(pid):
    """PIDs of the live children of ``pid``."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _start_with_workers(tmp_path):
    """A ``-j 2`` run in its own session, once its two workers are up."""
    tree = _slow_tree(tmp_path / "tree")
    process = subprocess.Popen(
        [sys.executable, "-m", "migrate", "-j", "2", str(tree)],
        cwd=REPO,
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while len(_children(process.pid)) < 2:
        assert process.poll() is None and time.monotonic() < deadline, "no workers started"
        time.sleep(0.05)
    return process


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigkill_of_a_parallel_run_leaves_no_worker_behind(tmp_path):
    process = _start_with_workers(tmp_path)
    workers = _children(process.pid)
    process.kill()
    process.wait(timeout=10)
    process.stderr.close()
    deadline = time.monotonic() + 10
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(map(_alive, workers))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_sigint_ends_a_parallel_run_with_a_summary_and_exit_130(tmp_path):
    process = _start_with_workers(tmp_path)
    workers = _children(process.pid)
    os.killpg(process.pid, signal.SIGINT)  # as Ctrl-C in a terminal: the whole group
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err
    last = summary_of(err)
    assert last.startswith("roundpipe-migrate: ") and last.endswith(" (interrupted)")
    assert not any(map(_alive, workers))


def test_sigint_in_process_ends_with_a_summary_and_exit_130_and_writes_nothing(tmp_path, capsys, monkeypatch):
    """The files are one project: nothing is shown or written before all were analysed."""
    (tmp_path / "a.py").write_text(AMP)
    (tmp_path / "b.py").write_text(AMP)

    def interrupted(source, path="<stdin>", exact=False, apex_target="compat"):
        if path.endswith("b.py"):
            raise KeyboardInterrupt
        return fake_migrate(source, path, exact, apex_target)

    monkeypatch.setattr(cli, "ENGINE", interrupted)
    code, out, err = run(capsys, "-w", tmp_path)
    assert code == 130 and out == ""
    assert (tmp_path / "a.py").read_text() == AMP
    assert err == ("roundpipe-migrate: 0 files checked, 0 migrated, 0 partial, 0 errors, 0 unchanged (interrupted)\n")


def test_a_worker_that_dies_costs_its_files_not_the_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli, "ENGINE", dying_migrate)
    (tmp_path / "a_plain.py").write_text("x = 1\n")  # done, or lost with the pool
    (tmp_path / "b_dies.py").write_text(AMP + "DIE = 1\n")
    for name in ("c.py", "d.py", "e.py"):
        (tmp_path / name).write_text(AMP)
    code, _, err = run(capsys, "-j", "2", "--report", tmp_path / "r.json", tmp_path)
    assert code == 2
    report = json.loads((tmp_path / "r.json").read_text())
    by_path = {Path(entry["path"]).name: entry for entry in report["files"]}
    assert by_path["b_dies.py"]["diagnostics"][0]["code"] == "RPM904"
    assert "a worker process died" in by_path["b_dies.py"]["diagnostics"][0]["message"]
    assert summary_of(err).startswith("roundpipe-migrate: 5 files checked")


def test_a_return_outside_a_function_is_a_syntax_error(tmp_path, capsys):
    path = tmp_path / "a.py"
    path.write_text("x = 1\nreturn x\n")
    code, _, err = run(capsys, path)
    assert code == 2
    assert err.splitlines()[0] == (f"{path}:2:1: RPM901 syntax error, file skipped: 'return' outside function")


def test_compiler_warnings_are_neither_errors_nor_noise(tmp_path):
    (tmp_path / "a.py").write_text('import re\npattern = re.compile("\\d+")\nassert (1, "x")\n')
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "migrate", str(tmp_path)],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout) == (0, "")
    assert done.stderr == ("roundpipe-migrate: 1 file checked, 0 would migrate, 0 partial, 0 errors, 1 unchanged\n")


def test_an_import_fallback_between_the_two_spellings_with_a_positional_argument_is_refused(tmp_path, capsys):
    """``GradScaler(device)`` under a torch.amp / torch.cuda.amp import fallback cannot be
    mapped (device first, or init_scale first?): RPM138, not an engine crash (RPM904)."""
    imports = (
        "try:\n    from torch.amp import GradScaler\nexcept ImportError:\n    from torch.cuda.amp import GradScaler\n"
    )
    source = BASIC.replace("import torch.nn as nn\n", "import torch.nn as nn\n" + imports, 1)
    path = tmp_path / "a.py"
    path.write_text(source.replace("torch.amp.GradScaler(device)", "GradScaler(device)"))
    code, _, err = run(capsys, path)
    assert code == 1 and "RPM138" in err and "RPM904" not in err
