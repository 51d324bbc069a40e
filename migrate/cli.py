"""``roundpipe-migrate``: the command line front end of the torch.amp / apex codemod.

::

    roundpipe-migrate PATH... [-w | -o DIR | --check] [--diff] [--exact]
                      [--report FILE.json] [-j N] [--exclude GLOB] [-q | -v]
                      [--color auto|always|never] [--apex-target compat|plain]

The tool gathers Python files (:mod:`migrate.files`), checks that each one compiles with
Python's own compiler, hands the ones that may use AMP (:mod:`migrate.prefilter`) to the
migration engine and prints every diagnostic to stderr as ``path:line:col: RPMnnn
message``. What happens to the migrated text depends on the mode: a unified diff on
stdout (the default), the file rewritten in place (``-w``), a copy in a mirrored tree
(``-o``), nothing but the names and the exit status (``--check``), or, for the single
PATH ``-``, the text on stdout.

Exit status: 0 when nothing is left to do, 1 when a file was only partly migrated (or,
with ``--check``, when a file would change), 2 for usage errors and for files that could
not be read, parsed or written, 130 when interrupted.

The engine is only used through ``migrate_source(source, path=..., exact=...,
apex_target=...) -> FileResult``, imported when the first file needs it (``--help`` and
runs on files without AMP never load it, nor ``libcst``); :data:`ENGINE` replaces it when
set. This module imports neither torch nor roundpipe.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import difflib
import functools
import json
import os
import re
import stat
import sys
import threading
import warnings
from typing import (
    Any,
    Callable,
    Dict,
    FrozenSet,
    Iterator,
    List,
    Optional,
    Sequence,
    TextIO,
    Tuple,
    TypeVar,
    Union,
)

from .diagnostics import Diagnostic, FileResult, Rewrite
from .files import Job, Refusal, Source, collect_jobs, decode, read_source, save, write_atomically
from .prefilter import might_use_amp, select_candidates

__all__ = ["ENGINE", "main", "migrate_text"]

Engine = Callable[..., FileResult]
T = TypeVar("T")

#: The function that migrates one file's text, called as ``engine(text, path=...,
#: exact=..., apex_target=...)``; None for the real engine
#: (``migrate.engine.migrate_source``). With ``-j N`` it must be a module-level
#: (picklable) function.
ENGINE: Optional[Engine] = None

PROG = "roundpipe-migrate"
STDIN_PATH = "<stdin>"
STATUSES = ("migrated", "partial", "error", "unchanged")
INTERRUPTED = 130
REPORT_VERSION = 2

#: Stack of the thread the engine runs on. libcst's native parser recurses once per
#: nesting level; on the usual 8 MiB stack a deep expression that Python accepts (10,000
#: chained ``and``) kills the process. Only the pages touched are ever allocated.
_ENGINE_STACK_BYTES = 512 << 20

_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")
_NO_NEWLINE_MARK = "\n\\ No newline at end of file\n"
_STYLES = {"bold": "1", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}

_EPILOG = """\
modes:
  default     print a unified diff of every file that would change; write nothing
  -w          rewrite changed files in place, atomically (temporary file, then
              rename), keeping mode, owner, group and line endings; a file with
              several hard links is rewritten in place so its links stay; a
              read-only file is reported and left alone
  -o DIR      write the migrated version of every file that changes to DIR, at its
              path relative to the PATH argument it was found under (a file given
              directly lands at DIR/NAME); unchanged files are not copied and the
              originals are never touched
  --check     write nothing, print no diff; name each file that would change and
              exit 1 if there is one
  PATH '-'    read stdin, write the migrated text to stdout (the diff instead with
              --diff, nothing with --check); must be the only PATH

Folders are searched for *.py in sorted order, skipping hidden folders, virtualenvs
(venv, any folder holding pyvenv.cfg), __pycache__, site-packages, symlinks to folders
and --exclude matches. A file named directly is processed whatever its name. A symlink
to a file found in a folder is read; -w rewrites its target only when that target lies
inside a folder PATH. FIFOs, devices and notebooks are reported and never read.

Every file is compiled (not run) by Python first: one that does not compile is reported
(RPM901) whatever it contains. Only files that mention a scaler or apex amp, and the
given files they import, are handed to the migration engine. A file that cannot be
read, is not UTF-8 or does not parse is reported and left alone; the other files are
still processed.

exit status:
  0    everything found was migrated, or there was nothing to do
  1    some file was only partly migrated (diagnostics left), or --check found changes
  2    usage error, or some file could not be read, parsed or written
  130  interrupted (Ctrl-C); the summary line says how far the run got
"""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a worker sends back for one file: the migrated text only if it changed."""

    migrated: Optional[str]
    rewrites: List[Rewrite]
    diagnostics: List[Diagnostic]
    wrapped_models: List[str] = dataclasses.field(default_factory=list)
    handed_classes: List[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Tally:
    """What the run has seen: files by status, how many changed, the report entries.

    ``dry`` (diff and check modes) words the summary as "would migrate"; report
    entries are only kept when ``report`` is set.
    """

    dry: bool = False
    report: bool = False
    files: int = 0
    statuses: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    changed: int = 0
    entries: List[Dict[str, Any]] = dataclasses.field(default_factory=list)

    def add(self, result: FileResult) -> None:
        """Count ``result`` (after anything done to it while writing)."""
        self.files += 1
        self.statuses[result.status] += 1
        self.changed += result.changed
        if self.report:
            self.entries.append({**result.to_json(), "changes": changes(result)})

    def summary(self) -> Dict[str, int]:
        """Counts for the report: all files, changed files, and files per status."""
        counts = {"files": self.files, "changed": self.changed}
        counts.update((status, self.statuses[status]) for status in STATUSES)
        return counts

    def summary_line(self, interrupted: bool = False) -> str:
        """The one line printed at the end of a run; its wording is stable."""
        files, errors = self.files, self.statuses["error"]
        migrated = "would migrate" if self.dry else "migrated"
        line = (
            f"{PROG}: {files} file{'s' * (files != 1)} checked, "
            f"{self.statuses['migrated']} {migrated}, {self.statuses['partial']} partial, "
            f"{errors} error{'s' * (errors != 1)}, {self.statuses['unchanged']} unchanged"
        )
        return line + " (interrupted)" if interrupted else line

    def exit_code(self, check: bool) -> int:
        """2 if any file is in error, else 1 if any is partial or (``check``) changed, else 0."""
        if self.statuses["error"]:
            return 2
        if self.statuses["partial"] or (check and self.changed):
            return 1
        return 0


@dataclasses.dataclass(frozen=True)
class Palette:
    """ANSI colours for one stream, or none."""

    enabled: bool

    def paint(self, text: str, style: str) -> str:
        """``text`` in ``style`` (a key of ``_STYLES``); a trailing line ending stays outside."""
        if not self.enabled or not text:
            return text
        body = text.rstrip("\r\n")
        return f"\x1b[{_STYLES[style]}m{body}\x1b[0m{text[len(body) :]}"


def use_color(choice: str, stream: TextIO) -> bool:
    """``--color`` for ``stream``: ``auto`` colours only a terminal, and only while the
    ``NO_COLOR`` environment variable is unset or empty."""
    if choice != "auto":
        return choice == "always"
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and not os.environ.get("NO_COLOR")


# ------------------------------------------------------------------------- migration


def migrate_text(
    text: str, path: str, engine: Engine, exact: bool, look: bool, apex_target: str = "compat"
) -> FileResult:
    """Check and migrate one file's ``text`` (without its BOM); never raises.

    Every text is checked with Python's compiler: one that does not compile gives an
    RPM901 error. The engine runs only when ``look`` is true, on a thread with a large stack. If
    the input is nested too deeply for it, the file gets RPM901; if the engine raises
    otherwise, or its changed text does not compile, RPM904 (an internal error); in both
    cases the file comes back unchanged.
    """
    unchanged = FileResult(path, text, text)
    problem = _syntax_error(text, path)
    if problem is not None:
        return dataclasses.replace(unchanged, diagnostics=[problem])
    if not look:
        return unchanged
    try:
        result = _on_deep_stack(functools.partial(engine, text, path=path, exact=exact, apex_target=apex_target))
    except (RecursionError, MemoryError) as err:
        message = f"nested too deeply for the migration engine ({type(err).__name__}); file skipped"
        return _left_unchanged(unchanged, "RPM901", message)
    except Exception as err:  # noqa: BLE001 - a bug in one file must not end the run
        message = (
            f"internal error: migration failed ({type(err).__name__}: {err}); file left unchanged (please report this)"
        )
        return _left_unchanged(unchanged, "RPM904", message)
    if result.changed and _syntax_error(result.migrated, path) is not None:
        message = "internal error: the migrated text does not compile; file left unchanged (please report this)"
        return _left_unchanged(result, "RPM904", message)
    return result


def _syntax_error(text: str, path: str) -> Optional[Diagnostic]:
    """An RPM901 diagnostic if Python does not compile ``text``, else None.

    Compiling to byte code is a little faster than building an ``ast`` tree and also
    catches what only the compiler checks (``return`` outside a function, a misplaced
    ``nonlocal``). Its warnings (invalid escape sequences, ...) are not this tool's to show.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, path, "exec", dont_inherit=True)
    except SyntaxError as err:
        line, col = err.lineno or 1, err.offset or 1
        message = f"syntax error, file skipped: {err.msg}"
        return Diagnostic(path, line, max(col, 1), "RPM901", message)
    except (ValueError, RecursionError, MemoryError) as err:  # NUL bytes, deep nesting
        reason = str(err) or type(err).__name__
        return Diagnostic(path, 1, 1, "RPM901", f"syntax error, file skipped: {reason}")
    return None


def _on_deep_stack(function: Callable[[], T]) -> T:
    """``function()`` run on a fresh thread with a ``_ENGINE_STACK_BYTES`` stack (on this
    thread where no such thread can be started)."""
    box: List[Tuple[bool, object]] = []

    def target() -> None:
        try:
            box.append((True, function()))
        except BaseException as err:  # noqa: BLE001 - handed to the calling thread
            box.append((False, err))

    try:
        previous = threading.stack_size(_ENGINE_STACK_BYTES)
    except (ValueError, RuntimeError):  # a platform that does not let us choose
        return function()
    try:
        thread = threading.Thread(target=target, name="roundpipe-migrate-engine", daemon=True)
        thread.start()
    except RuntimeError:  # no room for such a stack (ulimit -v): use this thread's
        return function()
    finally:
        threading.stack_size(previous)
    thread.join()
    done, value = box[0]
    if not done:
        assert isinstance(value, BaseException)
        raise value
    return value  # type: ignore[return-value]


def _left_unchanged(result: FileResult, code: str, message: str) -> FileResult:
    """``result`` with its changes dropped and an error ``code`` ``message`` at 1:1 added."""
    error = Diagnostic(result.path, 1, 1, code, message)
    return dataclasses.replace(result, migrated=result.original, rewrites=[], diagnostics=[*result.diagnostics, error])


def _refused(path: str, refusal: Refusal) -> FileResult:
    """The result for a file that was not processed: no text, just the refusal."""
    error = Diagnostic(path, refusal.line, refusal.col, refusal.code, refusal.message)
    return FileResult(path, "", "", diagnostics=[error])


def load(job: Job) -> Union[Source, FileResult]:
    """The decoded text of ``job``'s file, or the error result when it has none."""
    if job.problem is not None:
        return _refused(job.path, Refusal("RPM902", f"file could not be read: {job.problem}"))
    data = read_source(job.path)
    if isinstance(data, Refusal):
        return _refused(job.path, data)
    source = decode(data)
    return _refused(job.path, source) if isinstance(source, Refusal) else source


def read_stdin() -> Union[Source, FileResult]:
    """All of stdin, decoded like a file (see :func:`migrate.files.decode`)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # stdin replaced by a text stream: it is already decoded
        return Source(sys.stdin.read())
    source = decode(buffer.read())
    return _refused(STDIN_PATH, source) if isinstance(source, Refusal) else source


@dataclasses.dataclass(frozen=True)
class Task:
    """One file for a worker: its text, and whether the engine must look at it."""

    path: str
    text: str
    look: bool


def process(task: Task, engine: Engine, exact: bool, apex_target: str = "compat") -> Outcome:
    """Run :func:`migrate_text` on ``task`` and keep what the parent does not have."""
    result = migrate_text(task.text, task.path, engine, exact, task.look, apex_target)
    migrated = result.migrated if result.changed else None
    return Outcome(migrated, result.rewrites, result.diagnostics, result.wrapped_models, result.handed_classes)


def migrate_all(
    jobs: Sequence[Job], engine: Engine, exact: bool, processes: int, apex_target: str = "compat"
) -> Iterator[Tuple[Optional[Source], FileResult]]:
    """Each job's source (None when it could not be loaded) and result, in job order.

    All files are read and prefiltered here; with ``processes`` > 1 the parsing and the
    migration run in that many worker processes, costly files first. The files handed to
    the engine are one project: once every result is in, :func:`migrate.project.reconcile`
    keeps them consistent (no file changed while a file of the same program is refused).
    ``exact`` and ``apex_target`` go to the engine and to the reconciling migration.
    """
    loaded = [load(job) for job in jobs]
    present = [(job, item) for job, item in zip(jobs, loaded) if isinstance(item, Source)]
    look = select_candidates([job.path for job, _ in present], [item.text for _, item in present])
    tasks = [Task(job.path, item.text, chosen) for (job, item), chosen in zip(present, look)]
    worker = functools.partial(process, engine=engine, exact=exact, apex_target=apex_target)
    if processes > 1 and sum(task.look for task in tasks) > 1:
        from .pool import run_in_workers  # on use, not at start-up: --help stays fast (issue 14)

        if engine is real_engine:  # forked workers inherit it, not each importing it
            from . import engine as _  # noqa: F401

        costly = [task.look for task in tasks]
        outcomes = run_in_workers(tasks, costly, worker, processes, lost=_lost_in_a_worker)
    else:
        outcomes = map(worker, tasks)
    results = {}
    for task, outcome in zip(tasks, outcomes):
        migrated = task.text if outcome.migrated is None else outcome.migrated
        results[task.path] = FileResult(
            task.path,
            task.text,
            migrated,
            outcome.rewrites,
            outcome.diagnostics,
            outcome.wrapped_models,
            outcome.handed_classes,
        )
    _reconcile([task for task in tasks if task.look], results, exact, apex_target)
    for job, item in zip(jobs, loaded):
        yield (item, results[job.path]) if isinstance(item, Source) else (None, item)


def _reconcile(looked_at: Sequence[Task], results: Dict[str, FileResult], exact: bool, apex_target: str) -> None:
    """The project rules over the files the engine saw (a single file has no neighbours);
    they change the result objects in place."""
    if len(looked_at) < 2:
        return
    from .project import project_view, reconcile  # on use, not at start-up: --help stays fast (issue 14)

    files = project_view({task.path: task.text for task in looked_at})
    reconcile(files, {path: results[path] for path in files}, exact, apex_target)


def _lost_in_a_worker(task: Task) -> Outcome:
    """The outcome of a task whose worker process died before sending it back."""
    message = (
        "internal error: a worker process died while this file was being migrated or "
        "waiting for it; file left unchanged (please report this)"
    )
    return Outcome(None, [], [Diagnostic(task.path, 1, 1, "RPM904", message)])


def real_engine(source: str, path: str = STDIN_PATH, exact: bool = False, apex_target: str = "compat") -> FileResult:
    """``migrate.engine.migrate_source``, imported on the first call (not at start-up)."""
    from .engine import migrate_source

    return migrate_source(source, path=path, exact=exact, force=True, apex_target=apex_target)  # the CLI chose it


# ---------------------------------------------------------------------------- output


def unified_diff(result: FileResult) -> str:
    """The change as a unified diff with ``a/PATH`` and ``b/PATH`` headers.

    Lines are split on ``\\n`` only, so other line endings show exactly as stored; a last
    line without a newline is marked the way patch(1) expects.
    """
    name = result.path.replace(os.sep, "/")
    lines = difflib.unified_diff(
        _LINE.findall(result.original), _LINE.findall(result.migrated), f"a/{name}", f"b/{name}"
    )
    return "".join(line if line.endswith("\n") else line + _NO_NEWLINE_MARK for line in lines)


def changes(result: FileResult) -> List[Dict[str, Any]]:
    """The changed regions of ``result`` for the report, each labelled with its line
    numbers in the original and in the new text (``start`` is 1-based; a ``count`` of 0
    is an empty range placed before line ``start``, as in a unified diff hunk)."""
    if not result.changed:
        return []
    old, new = _LINE.findall(result.original), _LINE.findall(result.migrated)
    kinds = {"replace": "replaced", "delete": "removed", "insert": "inserted"}
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    return [
        {
            "kind": kinds[tag],
            "original": {"start": i1 + 1, "count": i2 - i1},
            "new": {"start": j1 + 1, "count": j2 - j1},
            "source": "diff",
        }
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


def color_diff(diff: str, palette: Palette) -> str:
    """``diff`` with headers bold, hunk lines cyan, added lines green, removed ones red."""
    if not palette.enabled:
        return diff
    painted = []
    for line in _LINE.findall(diff):
        if line.startswith(("---", "+++")):
            painted.append(palette.paint(line, "bold"))
        elif line.startswith("@@"):
            painted.append(palette.paint(line, "cyan"))
        elif line.startswith(("+", "-")):
            painted.append(palette.paint(line, "green" if line[0] == "+" else "red"))
        else:
            painted.append(line)
    return "".join(painted)


def emit(text: str) -> None:
    """Write ``text`` to stdout as UTF-8 with its line endings untouched."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
        return
    buffer.write(text.encode("utf-8"))
    buffer.flush()


def format_diagnostic(diagnostic: Diagnostic, palette: Palette) -> str:
    """``path:line:col: CODE message`` with the location bold and the code coloured by
    kind (red: not processed, yellow: left with a diagnostic, cyan: information)."""
    location = f"{diagnostic.path}:{diagnostic.line}:{diagnostic.col}:"
    style = "red" if diagnostic.is_error else "cyan" if diagnostic.is_info else "yellow"
    return f"{palette.paint(location, 'bold')} {palette.paint(diagnostic.code, style)} {diagnostic.message}"


@dataclasses.dataclass(frozen=True)
class Run:
    """The options of one run, as :func:`deliver` and :func:`show` need them."""

    options: argparse.Namespace
    roots: FrozenSet[str]
    out: Palette
    err: Palette


def deliver(job: Job, source: Optional[Source], result: FileResult, run: Run) -> FileResult:
    """Put the migrated text where the mode says and return the final result.

    For ``-`` the text goes to stdout (unless ``--diff`` or ``--check``). With ``-w`` or
    ``-o`` a changed file that is not in error is written (:func:`migrate.files.save`,
    :func:`migrate.files.write_atomically`), its BOM kept; if that is refused or fails,
    nothing is half-written and the result gains an RPM902 error.
    """
    options = run.options
    text = source.restore(result.migrated) if source is not None else result.migrated
    if options.stdin:
        if not (options.diff or options.check):
            emit(text)
        return result
    if not (options.write or options.output) or not result.changed or result.status == "error":
        return result
    target = os.path.realpath(job.path) if options.write else os.path.join(options.output, job.rel)
    try:
        if options.write:
            refusal = save(job.path, text, job.in_folder, run.roots)
        else:
            write_atomically(target, text, stat.S_IMODE(os.stat(job.path).st_mode))
            refusal = None
    except OSError as err:
        refusal = Refusal(
            "RPM902", f"migrated text could not be written to {target} ({err.strerror or err}); file left unchanged"
        )
    if refusal is None:
        return result
    error = Diagnostic(result.path, refusal.line, refusal.col, refusal.code, refusal.message)
    return dataclasses.replace(result, diagnostics=[*result.diagnostics, error])


def show(result: FileResult, run: Run) -> None:
    """Print ``result``: its diagnostics to stderr (info ones not with ``-q``), its diff
    to stdout when the mode shows diffs, with ``--check`` the name of a file that would
    change, and with ``-v`` its status to stderr."""
    options = run.options
    for diagnostic in result.diagnostics:
        if not (options.quiet and diagnostic.is_info):
            print(format_diagnostic(diagnostic, run.err), file=sys.stderr)
    if options.show_diff and result.changed:
        emit(color_diff(unified_diff(result), run.out))
    if options.check and result.changed and not options.quiet:
        print(f"would migrate {run.err.paint(result.path, 'bold')}", file=sys.stderr)
    if options.verbose:
        status = "would migrate" if options.dry and result.status == "migrated" else result.status
        print(f"{result.path}: {status}", file=sys.stderr)


def write_report(path: str, tally: Tally, options: argparse.Namespace) -> None:
    """Write the JSON report of ``tally`` to ``path``; raises OSError.

    Besides the files and the summary it records the mode (``diff``, ``check``,
    ``write``, ``output`` or ``stdout``) and where migrated text went (``output``: the
    ``-o`` folder, ``"in place"``, ``"stdout"``, or null when nothing was written).
    """
    report = {
        "version": REPORT_VERSION,
        "mode": options.mode,
        "output": _output_location(options),
        "files": tally.entries,
        "summary": tally.summary(),
    }
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
        handle.write("\n")


def _output_location(options: argparse.Namespace) -> Optional[str]:
    """Where the migrated text of this run went (see :func:`write_report`)."""
    if options.mode == "output":
        return os.path.abspath(str(options.output))
    return {"write": "in place", "stdout": "stdout"}.get(str(options.mode))


# ---------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``roundpipe-migrate``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Rewrite torch.amp / apex mixed-precision training scripts into the RoundPipe form.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="file or folder to migrate (a folder: every *.py below it); '-' for stdin",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-w", "--write", action="store_true", help="rewrite changed files in place")
    mode.add_argument(
        "-o",
        "--output-dir",
        dest="output",
        metavar="DIR",
        help="write changed files to DIR, mirroring their paths; originals untouched",
    )
    mode.add_argument(
        "--check",
        action="store_true",
        help="write nothing; name each file that would change and exit 1 if any would",
    )
    parser.add_argument("--diff", action="store_true", help="print the diff also with -w, -o or --check")
    parser.add_argument(
        "--exact",
        action="store_true",
        help="emit step(..., is_async=False) (scaler.update() then follows a waited-for step) "
        "so the migrated script reproduces the original's numbers",
    )
    parser.add_argument(
        "--apex-target",
        choices=("compat", "plain"),
        default="compat",
        help="apex scripts: call roundpipe.compat (default; any setting, apex's numbers), or write "
        "plain code upstream RoundPipe can run where the settings are literals it can follow "
        "(O0-O3; other files stay on compat with RPM303; see docs/apex.md)",
    )
    parser.add_argument(
        "--report",
        metavar="FILE.json",
        help="write a JSON report: the mode, where output went, every file and every change",
    )
    parser.add_argument(
        "-j",
        "--jobs",
        type=_positive_int,
        default=1,
        metavar="N",
        help="process files in N worker processes (default 1: in this process)",
    )
    parser.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="GLOB",
        help="skip files and folders below a folder PATH whose relative path or name matches GLOB (repeatable)",
    )
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour diagnostics and diffs (default auto: only on a terminal, and not when NO_COLOR is set)",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no summary line, no info (RPM3xx) diagnostics, no --check file names",
    )
    talk.add_argument("-v", "--verbose", action="store_true", help="also print each file's status")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parse and check ``argv``; adds ``stdin``, ``mode``, ``dry`` and ``show_diff``.

    Raises SystemExit (2 for a usage error, 0 after ``--help``) as argparse does.
    """
    parser = build_parser()
    options = parser.parse_args(argv)
    options.stdin = "-" in options.paths
    if options.stdin and len(options.paths) > 1:
        parser.error("'-' (stdin) must be the only PATH")
    if options.stdin and (options.write or options.output):
        parser.error("'-' (stdin) cannot be combined with -w or -o")
    if options.check:
        options.mode = "check"
    elif options.write:
        options.mode = "write"
    elif options.output:
        options.mode = "output"
    elif options.stdin and not options.diff:
        options.mode = "stdout"
    else:
        options.mode = "diff"
    options.dry = options.mode in ("check", "diff")
    options.show_diff = options.diff or options.mode == "diff"
    return options


def _positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return value


def _mirror_problem(jobs: Sequence[Job], output: str) -> Optional[str]:
    """Why ``-o output`` cannot take ``jobs``: a copy would land on its own original, or two
    files would be written to the same place; None when every file has a place of its own."""
    owners: Dict[str, str] = {}
    for job in jobs:
        target = os.path.realpath(os.path.join(output, job.rel))
        if target == os.path.realpath(job.path):
            return f"-o would overwrite {job.path} itself"
        if target in owners:
            return f"-o would write both {owners[target]} and {job.path} to {target}"
        owners[target] = job.path
    return None


def _stdin_results(engine: Engine, exact: bool, apex_target: str) -> Iterator[Tuple[Optional[Source], FileResult]]:
    source = read_stdin()
    if isinstance(source, FileResult):
        yield None, source
    else:
        look = might_use_amp(source.text)
        yield source, migrate_text(source.text, STDIN_PATH, engine, exact, look, apex_target)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``roundpipe-migrate`` on ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        options = parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return int(exc.code or 0)
    run = Run(
        options,
        frozenset(os.path.realpath(path) for path in options.paths if os.path.isdir(path)),
        Palette(use_color(options.color, sys.stdout)),
        Palette(use_color(options.color, sys.stderr)),
    )
    tally = Tally(dry=options.dry, report=bool(options.report))
    try:
        code = _run(run, tally)
    except KeyboardInterrupt:
        print(tally.summary_line(interrupted=True), file=sys.stderr)
        return INTERRUPTED
    if not options.quiet and code is not None:
        print(run.err.paint(tally.summary_line(), "bold"), file=sys.stderr)
    return 2 if code is None else code


def _run(run: Run, tally: Tally) -> Optional[int]:
    """Process every file of the run into ``tally``; the exit status, or None after a
    usage error (already printed)."""
    options = run.options
    engine = real_engine if ENGINE is None else ENGINE
    if options.stdin:
        jobs = [Job(STDIN_PATH, STDIN_PATH)]
        results = _stdin_results(engine, options.exact, options.apex_target)
    else:
        skip = frozenset([os.path.realpath(options.output)]) if options.output else frozenset()
        jobs = collect_jobs(options.paths, options.exclude, skip)
        problem = _mirror_problem(jobs, options.output) if options.output else None
        if problem is not None:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
            return None
        results = migrate_all(jobs, engine, options.exact, options.jobs, options.apex_target)
    for job, (source, result) in zip(jobs, results):
        result = deliver(job, source, result, run)
        show(result, run)
        tally.add(result)
    code = tally.exit_code(options.check)
    if options.report:
        try:
            write_report(options.report, tally, options)
        except OSError as err:
            reason = f"report could not be written to {options.report}: {err}"
            print(f"{PROG}: error: {reason}", file=sys.stderr)
            code = 2
    return code
