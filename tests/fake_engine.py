"""Stand-in migration engines for the command line tests.

They live in a module of their own so that ``roundpipe-migrate -j N`` worker processes can
unpickle them. ``fake_migrate`` follows simple text rules:

* ``GradScaler`` in the source: ``# migrated\\n`` is appended (``# migrated exact\\n`` with
  ``exact=True``; `` for plain`` added with ``apex_target="plain"``), so the file counts
  as changed;
* ``DataParallel``: an RPM101 diagnostic (the file becomes "partial");
* ``NOTE``: an RPM301 info diagnostic (does not change the status).
"""

import os
import signal
import time

from migrate.diagnostics import CODES, Diagnostic, FileResult, Rewrite


def fake_migrate(source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat") -> FileResult:
    """Migrate ``source`` by the text rules in the module docstring."""
    result = FileResult(path=path, original=source, migrated=source)
    if "GradScaler" in source:
        target = "" if apex_target == "compat" else f" for {apex_target}"
        result.migrated = source + ("# migrated exact" if exact else "# migrated") + target + "\n"
        result.rewrites.append(Rewrite(1, "marked as migrated"))
    if "DataParallel" in source:
        result.diagnostics.append(Diagnostic(path, 1, 1, "RPM101", CODES["RPM101"]))
    if "NOTE" in source:
        result.diagnostics.append(Diagnostic(path, 1, 1, "RPM301", "a note on the migrated code"))
    return result


def uncompilable_migrate(
    source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat"
) -> FileResult:
    """Return a "migration" that is not valid Python."""
    return FileResult(path=path, original=source, migrated=source + "def (:\n")


def misplaced_return_migrate(
    source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat"
) -> FileResult:
    """Return a "migration" that parses but does not compile (``return`` at module level)."""
    return FileResult(path=path, original=source, migrated=source + "return 1\n")


def crashing_migrate(
    source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat"
) -> FileResult:
    """Break the engine's promise never to raise."""
    raise RuntimeError("engine bug")


def rewriting_migrate(
    source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat"
) -> FileResult:
    """Drop the first line and turn ``y = 2`` into two lines (for the report's changes)."""
    migrated = source.split("\n", 1)[1].replace("y = 2\n", "y = 2  # one\ny2 = 2\n")
    return FileResult(path=path, original=source, migrated=migrated)


def noting_migrate(source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat") -> FileResult:
    """``fake_migrate`` that also leaves an RPM301 note saying the engine saw the file."""
    result = fake_migrate(source, path, exact, apex_target)
    result.diagnostics.append(Diagnostic(path, 1, 1, "RPM301", "seen by the engine"))
    return result


def dying_migrate(source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat") -> FileResult:
    """``fake_migrate``, except that a source containing ``DIE`` kills the process at once,
    as a crash in native code or the OOM killer would."""
    if "DIE" in source:
        os.kill(os.getpid(), signal.SIGKILL)
    return fake_migrate(source, path, exact, apex_target)


def waiting_migrate(source: str, path: str = "<stdin>", exact: bool = False, apex_target: str = "compat") -> FileResult:
    """``fake_migrate`` after 0.4 s of sleep: costly without using the CPU, so two workers
    overlap however busy the machine is."""
    time.sleep(0.4)
    return fake_migrate(source, path, exact, apex_target)
