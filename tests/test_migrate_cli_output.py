"""What roundpipe-migrate prints (issue 13): "would migrate" in the modes that write
nothing, and colour with ``--color auto|always|never`` (auto: a terminal, NO_COLOR unset)."""

import os
import pty
import select
import subprocess
import sys

import pytest

from fake_engine import fake_migrate
from migrate import cli
from migrate_cli_support import AMP, REPO, run

PARTIAL = AMP + "m = DataParallel(m)\n"
ESC = "\x1b["


@pytest.fixture
def fake(monkeypatch):
    """Use the fake engine for the test."""
    monkeypatch.setattr(cli, "ENGINE", fake_migrate)


@pytest.mark.parametrize(
    ("flags", "word"),
    [([], "would migrate"), (["--check"], "would migrate"), (["-w"], "migrated")],
)
def test_summary_says_would_migrate_only_when_nothing_is_written(tmp_path, capsys, fake, flags, word):
    (tmp_path / "a.py").write_text(AMP)
    _, _, err = run(capsys, *flags, tmp_path)
    assert err.splitlines()[-1] == (f"roundpipe-migrate: 1 file checked, 1 {word}, 0 partial, 0 errors, 0 unchanged")


def test_color_always_paints_the_diff_the_diagnostics_and_the_summary(tmp_path, capsys, fake):
    (tmp_path / "a.py").write_text(PARTIAL)
    code, out, err = run(capsys, "--color", "always", tmp_path)
    assert code == 1
    name = (tmp_path / "a.py").as_posix()
    assert out.splitlines()[:3] == [
        f"\x1b[1m--- a/{name}\x1b[0m",
        f"\x1b[1m+++ b/{name}\x1b[0m",
        "\x1b[36m@@ -1,3 +1,4 @@\x1b[0m",
    ]
    assert "\x1b[32m+# migrated\x1b[0m" in out.splitlines()
    assert err.splitlines()[0] == (
        f"\x1b[1m{tmp_path / 'a.py'}:1:1:\x1b[0m \x1b[33mRPM101\x1b[0m "
        "model wrapped in DistributedDataParallel/DataParallel"
    )
    assert err.splitlines()[-1].startswith("\x1b[1mroundpipe-migrate: 1 file checked")


def test_color_keeps_crlf_line_endings_outside_the_colour(tmp_path, capsys, fake):
    (tmp_path / "a.py").write_bytes(b"scaler = GradScaler()\r\nx = 1\r\n")
    _, out, _ = run(capsys, "--color", "always", tmp_path)
    assert " x = 1\r\n" in out and "\x1b[32m+# migrated\x1b[0m\n" in out


def test_color_never_and_auto_off_a_terminal_print_plain_text(tmp_path, capsys, fake):
    (tmp_path / "a.py").write_text(PARTIAL)
    for flags in (["--color", "never"], []):
        _, out, err = run(capsys, *flags, tmp_path)
        assert ESC not in out and ESC not in err and "+# migrated" in out


def _on_a_terminal(args, env):
    """Run the tool with stdout and stderr on a pseudo-terminal; what it printed."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "migrate", *args],
        cwd=REPO,
        stdout=terminal,
        stderr=terminal,
        stdin=subprocess.DEVNULL,
        env={**env, "PYTHONPATH": str(REPO)},
    )
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 60)
        assert ready, "no output from the tool within 60 s"
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert process.wait(timeout=60) == 0
    return b"".join(chunks).decode()


def test_color_auto_paints_a_terminal_unless_no_color_is_set(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    env = {key: value for key, value in os.environ.items() if key != "NO_COLOR"}
    assert ESC + "1mroundpipe-migrate: 1 file checked" in _on_a_terminal([str(tmp_path)], env)
    plain = _on_a_terminal([str(tmp_path)], {**env, "NO_COLOR": "1"})
    assert ESC not in plain and "roundpipe-migrate: 1 file checked" in plain


def test_color_rejects_other_values(capsys):
    code, _, err = run(capsys, "--color", "sometimes", "x.py")
    assert code == 2 and "invalid choice: 'sometimes'" in err
