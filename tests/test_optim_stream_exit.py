"""Interpreter exit with optimizer work queued: a failure nobody waited for makes the exit
status 1; a Ctrl-C says which job the exit waits for, and a second one stops the wait."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.timeout(90)

_PRELUDE = """
import sys, time
import torch
from roundpipe import RoundPipe
model = RoundPipe(torch.nn.Linear(3, 2))
opt = torch.optim.SGD(model.optim_parameters(), lr=0.1)
model.forward_backward((torch.ones(4, 3),), loss_fn=lambda out, label: out.sum())
"""


def _script(tmp_path, body: str):
    path = tmp_path / "train.py"
    path.write_text(_PRELUDE + textwrap.dedent(body))
    return [sys.executable, str(path)]


def _run(tmp_path, body: str) -> subprocess.CompletedProcess:
    return subprocess.run(_script(tmp_path, body), capture_output=True, text=True, timeout=60)


def test_a_last_step_that_fails_at_exit_makes_the_exit_status_non_zero(tmp_path):
    done = _run(
        tmp_path,
        """
        def last_step():
            raise ValueError("the last step broke")
        model.step(last_step)   # nobody waits for it: the script ends here
        print("script done")
    """,
    )
    assert done.returncode == 1, done.stderr
    assert "script done" in done.stdout  # stdout is flushed before the exit
    assert "optimizer work failed and nobody waited for it" in done.stderr
    assert "ValueError: the last step broke" in done.stderr and "last_step" in done.stderr


@pytest.mark.slow
def test_a_last_step_that_succeeds_at_exit_is_silent_and_exits_zero(tmp_path):
    done = _run(
        tmp_path,
        """
        model.step(lambda: (time.sleep(0.2), opt.step()))
    """,
    )
    assert done.returncode == 0, done.stderr
    assert "roundpipe" not in done.stderr


class _Stderr:
    """A child's stderr, read without buffering (so select() sees all of it) until a text
    appears or a deadline passes."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process, self.seen = process, ""

    def wait_for(self, text: str, seconds: float = 40.0) -> None:
        deadline = time.monotonic() + seconds
        fd = self.process.stderr.fileno()
        while text not in self.seen:
            ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
            chunk = os.read(fd, 65536).decode(errors="replace") if ready else ""
            if not chunk:
                self.process.kill()
                pytest.fail(f"{text!r} never appeared on stderr; got:\n{self.seen}")
            self.seen += chunk

    def rest(self) -> str:
        self.seen += self.process.stderr.read().decode(errors="replace")
        return self.seen


def test_ctrl_c_at_exit_says_what_it_waits_for_and_a_second_one_abandons_the_wait(tmp_path):
    """One process (starting torch is slow): the first Ctrl-C ends the script while a step
    is pending, the exit says which job it waits for; the second stops that wait."""
    process = subprocess.Popen(
        _script(
            tmp_path,
            """
        import threading
        started = threading.Event()
        def slow_step():
            started.set()
            time.sleep(60)
        model.step(slow_step)
        started.wait(30)  # the job runs: on a loaded machine the worker may pick it up late
        print("ready", file=sys.stderr, flush=True)
        time.sleep(60)
    """,
        ),
        stderr=subprocess.PIPE,
    )
    stderr = _Stderr(process)
    stderr.wait_for("ready")
    process.send_signal(signal.SIGINT)
    stderr.wait_for("press Ctrl-C to stop waiting")
    assert "KeyboardInterrupt" in stderr.seen
    assert "roundpipe: waiting for <roundpipe optimizer job 1: RoundPipe step 1: slow_step>" in stderr.seen
    process.send_signal(signal.SIGINT)
    assert process.wait(30) == 130
    text = stderr.rest()
    assert "Interrupted while waiting for optimizer job 1" in text
    assert "in slow_step" in text  # the optimizer thread's stack
    assert "abandoned" in text
