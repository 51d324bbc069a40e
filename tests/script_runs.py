"""Running a test's program text as a script, the way a user would run it."""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import pathlib
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Union

RUNNER = pathlib.Path(__file__).with_name("forking_runner.py")
# Set by pytest for each test; the child gets the current value (other differences from the
# runner's environment could have been read at startup, so they take a plain subprocess).
PER_TEST_VARIABLE = "PYTEST_CURRENT_TEST"
PathLike = Union[str, "os.PathLike[str]"]


def run_script(source: str, folder: pathlib.Path, name: str, argv: Sequence[str] = ()) -> str:
    """Write ``source`` to ``folder / name``, run it as ``__main__`` in this process with
    ``argv`` as its arguments (``sys.argv`` is put back after), and return what it printed."""
    script = folder / name
    script.write_text(source)
    out = io.StringIO()
    saved = list(sys.argv)
    sys.argv = [str(script), *argv]
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv[:] = saved
    return out.getvalue()


class _ForkingRunner:
    """The client of one :mod:`forking_runner` process, started with this process's
    environment; runs one script at a time."""

    def __init__(self) -> None:
        self.env: Dict[str, str] = _without_per_test(os.environ)
        self.process = subprocess.Popen(
            [sys.executable, str(RUNNER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env
        )
        self._pending = b""
        self.usable = bool(self._message(None).get("ready"))

    def _message(self, deadline: Optional[float]) -> dict:
        """The runner's next line (``TimeoutError`` past ``deadline``, a ``time.monotonic``)."""
        assert self.process.stdout is not None
        fd = self.process.stdout.fileno()
        while b"\n" not in self._pending:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the forking runner ended (exit {self.process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv: List[str], cwd: str, timeout: Optional[float]) -> subprocess.CompletedProcess:
        """``argv`` (a script and its arguments) run in a forked child, as ``subprocess.run``
        with ``capture_output=True, text=True`` reports it."""
        assert self.process.stdin is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        with tempfile.TemporaryDirectory() as folder:
            out, err = os.path.join(folder, "stdout"), os.path.join(folder, "stderr")
            pathlib.Path(out).touch()
            pathlib.Path(err).touch()
            request = {"argv": argv, "cwd": cwd, "env": dict(os.environ), "stdout": out, "stderr": err}
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
            pid = self._message(None)["pid"]
            try:
                returncode = self._message(deadline)["returncode"]
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                self._message(None)
                raise subprocess.TimeoutExpired(
                    [sys.executable, *argv], timeout or 0.0, _decoded(out), _decoded(err)
                ) from None
            except BaseException:  # interrupted (pytest-timeout, ^C): end the run and the runner
                os.kill(pid, signal.SIGKILL)
                self.close()
                raise
            return subprocess.CompletedProcess([sys.executable, *argv], returncode, _decoded(out), _decoded(err))

    def close(self) -> None:
        """End the runner (it exits when its stdin closes); it is not used again."""
        assert self.process.stdin is not None
        self.usable = False
        self.process.stdin.close()
        self.process.wait()


def _without_per_test(environment: "os._Environ[str]") -> Dict[str, str]:
    return {name: value for name, value in environment.items() if name != PER_TEST_VARIABLE}


def _decoded(path: str) -> str:
    """A captured stream as ``subprocess.run(text=True)`` gives it (locale encoding,
    universal newlines)."""
    with open(path, "rb") as captured:
        return io.TextIOWrapper(io.BytesIO(captured.read())).read()


_runner: Optional[_ForkingRunner] = None


def _forking_runner() -> Optional[_ForkingRunner]:
    """This process's runner, started on first use; None where fork is unavailable or the
    runner could not prove it safe."""
    global _runner
    if not sys.platform.startswith("linux"):
        return None
    if _runner is None or _runner.process.returncode is not None:
        _runner = _ForkingRunner()
        atexit.register(_runner.close)
    return _runner if _runner.usable else None


def run_python(
    argv: Sequence[PathLike], cwd: Optional[PathLike] = None, timeout: Optional[float] = None, fresh: bool = False
) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True,
    timeout=timeout)`` for ``argv`` = a script and its arguments, served by a forked child of
    a Python that has already imported torch (see :mod:`forking_runner`): the same exit code,
    output and traceback, without importing torch again. Where fork is unavailable, or this
    process's environment has changed since the runner started, or ``fresh`` asks for a new
    interpreter (its own string hash seed: the second run of a "prints the same twice" check),
    it is that plain subprocess.
    """
    arguments = [os.fspath(a) for a in argv]
    folder = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
    runner = _forking_runner()
    plain = fresh or arguments[0].startswith("-") or not os.path.isdir(folder)
    if runner is None or plain or runner.env != _without_per_test(os.environ):
        return subprocess.run([sys.executable, *arguments], cwd=folder, capture_output=True, text=True, timeout=timeout)
    return runner.run(arguments, folder, timeout)
