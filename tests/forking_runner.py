"""A Python that has imported torch once and forks a fresh child for each script it is asked
to run (started by :func:`script_runs.run_python`; not a test module).

Protocol, one JSON object a line: the client writes ``{"argv", "cwd", "env", "stdout",
"stderr"}`` (``env`` differs from this process's only in what no startup code reads);
this process forks, answers ``{"pid": ...}`` at once and ``{"returncode": ...}`` when the
child has ended (``subprocess``'s convention: minus the signal's number when one killed it).
The child runs ``argv[0]`` the way ``python argv[0] argv[1:]`` would: ``sys.argv`` as given,
``sys.path[0]`` the script's folder, ``__main__`` a fresh module whose ``__file__`` is the
absolute path, the traceback of an uncaught exception on stderr with exit code 1,
``SystemExit``'s code, then the interpreter's own finalization (the child leaves by raising
``SystemExit`` out of :func:`serve`, so non-daemon threads are joined, ``atexit`` callbacks,
finalizers and the final flush run as in a fresh ``python``). torch's and numpy's global
random generators are reseeded from the OS in each child, as a fresh import would seed them.
What a program can still tell apart: torch (and what torch imports) and ``torch._dynamo``
(which the first ``torch.optim.Optimizer`` would import, seconds of every run) are already in
``sys.modules``, the string hash seed is the runner's (so a test that a script prints the
same twice must run the second time as a plain subprocess), and a traceback or
``inspect.stack()`` taken inside the script has the runner's frames below the script's.

At startup it checks that importing torch left only this one Python thread (forking copies
the calling thread only; the native BLAS pool numpy starts re-makes itself after a fork); the
first line it writes says whether that held.
"""

import builtins
import ctypes
import importlib.machinery
import json
import os
import signal
import sys
import threading
import types

import torch  # noqa: F401 - the point: every child starts with torch imported
import torch._dynamo  # noqa: F401 - imported by the first optimizer's constructor


def _exit_code(exit: SystemExit) -> int:
    """The process exit status ``python`` gives for ``raise SystemExit(code)``."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def _run_main(script: str) -> int:
    """Run ``script`` as ``__main__`` in this (forked) process; its exit status."""
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=script,
        __cached__=None,
        __builtins__=builtins,
        __loader__=importlib.machinery.SourceFileLoader("__main__", script),
    )
    sys.modules["__main__"] = main
    status = 0
    try:
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        exec(code, main.__dict__)
    except SystemExit as exit:
        status = _exit_code(exit)
    except BaseException as error:  # noqa: BLE001 - reported as the interpreter reports it
        # Drop this function's frame: the traceback starts at the script, as python's does.
        traceback = error.__traceback__.tb_next if error.__traceback__ is not None else None
        sys.excepthook(type(error), error.with_traceback(traceback), traceback)
        if isinstance(error, KeyboardInterrupt):
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        status = 1
    return status


def _reseed() -> None:
    """Give this child its own random state, as a fresh interpreter's imports would (after a
    fork every child would otherwise draw the same numbers; ``random`` reseeds itself)."""
    torch.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _child(request: dict) -> None:
    """In the forked child: take the request's folder, streams and argv, run the script, and
    leave by raising ``SystemExit`` with its status out of :func:`serve`, so that the
    interpreter's own finalization runs; a failed setup exits 1 at once."""
    try:
        _die_with_parent()
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, (name, flags) in enumerate(
            [(os.devnull, os.O_RDONLY), (request["stdout"], os.O_WRONLY), (request["stderr"], os.O_WRONLY)]
        ):
            opened = os.open(name, flags)
            os.dup2(opened, fd)
            os.close(opened)
        script = os.path.abspath(request["argv"][0])
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # python resolves links here too
        _reseed()
    except BaseException:  # noqa: BLE001 - the setup failed: say why, exit 1
        sys.excepthook(*sys.exc_info())
        os._exit(1)
    raise SystemExit(_run_main(script))


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent ends (``PR_SET_PDEATHSIG``), so that
    neither the runner nor a hung child outlives a test process that died without closing
    the runner's stdin; elsewhere nothing is done (the runner is used on Linux only)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:
    """Answer requests from stdin until it closes."""
    _die_with_parent()
    _answer({"ready": threading.active_count() == 1})
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        _answer({"pid": pid})
        _, wait_status = os.waitpid(pid, 0)
        _answer({"returncode": os.waitstatus_to_exitcode(wait_status)})


if __name__ == "__main__":
    serve()
