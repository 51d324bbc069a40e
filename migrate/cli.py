"""``roundpipe-migrate``: the command line front end of the torch.amp / apex codemod.

::

    roundpipe-migrate PATH... [-w | -o DIR | --check] [--diff] [--exact]
                      [--report FILE.json] [-j N] [--exclude GLOB] [-q | -v]

The tool gathers Python files (a folder is searched for ``*.py``, skipping hidden,
virtualenv, ``__pycache__`` and ``site-packages`` folders), reads each one exactly
(UTF-8, line endings kept), hands the ones that mention an AMP marker to the migration
engine and prints every diagnostic to stderr as ``path:line:col: RPMnnn message``. What
happens to the migrated text depends on the mode: a unified diff on stdout (the default),
the file rewritten in place (``-w``), a copy in a mirrored tree (``-o``), nothing but the
exit status (``--check``), or, for the single PATH ``-``, the text on stdout.

Exit status: 0 when nothing is left to do, 1 when a file was only partly migrated (or,
with ``--check``, when a file would change), 2 for usage errors and for files that could
not be read, parsed or written.

The engine is only used through ``migrate_source(source, path=..., exact=...) ->
FileResult``, looked up in :data:`ENGINE` once per run. This module imports neither
torch nor roundpipe.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import difflib
import fnmatch
import functools
import json
import os
import re
import stat
import sys
import tempfile
from typing import Callable, Dict, FrozenSet, Iterator, List, Optional, Sequence

from .diagnostics import Diagnostic, FileResult
from .engine import migrate_source
from .prefilter import might_use_amp

__all__ = ["ENGINE", "main"]

Engine = Callable[..., FileResult]

#: The function that migrates one file's text. Read once per run and handed to the
#: worker processes, so with ``-j N`` it must be a module-level (picklable) function.
ENGINE: Engine = migrate_source

PROG = "roundpipe-migrate"
STDIN_PATH = "<stdin>"
STATUSES = ("migrated", "partial", "error", "unchanged")
COMPILE_FAILURE = "migrated output does not compile; file left unchanged (please report this)"

_SKIPPED_FOLDER_NAMES = frozenset({"venv", "__pycache__", "site-packages"})
_LINE = re.compile(r"[^\n]*\n|[^\n]+\Z")
_NO_NEWLINE_MARK = "\n\\ No newline at end of file\n"

_EPILOG = """\
modes:
  default     print a unified diff of every file that would change; write nothing
  -w          rewrite changed files in place, atomically (temporary file, then
              rename), keeping permission bits and line endings
  -o DIR      write the migrated version of every file that changes to DIR, at its
              path relative to the PATH argument it was found under (a file given
              directly lands at DIR/NAME); unchanged files are not copied and the
              originals are never touched
  --check     write nothing and print no diff; exit 1 if any file would change
  PATH '-'    read stdin, write the migrated text to stdout (the diff instead with
              --diff, nothing with --check); must be the only PATH

Folders are searched for *.py in sorted order, skipping hidden folders, virtualenvs
(venv, any folder holding pyvenv.cfg), __pycache__, site-packages and --exclude matches.
A file named directly is processed whatever its name.

A file that cannot be read, is not UTF-8, does not parse, or whose migrated text would
not compile is reported and left alone; the other files are still processed.

exit status:
  0  everything found was migrated, or there was nothing to do
  1  some file was only partly migrated (diagnostics left), or --check found changes
  2  usage error, or some file could not be read, parsed or written
"""


@dataclasses.dataclass(frozen=True)
class Job:
    """One file to process.

    ``path`` is what is opened and what diagnostics show; ``rel`` is the path relative to
    the PATH argument it was found under (where ``-o`` puts its copy). ``problem``, when
    set, says why the file's folder could not be listed; the job then reports RPM902.
    """

    path: str
    rel: str
    problem: Optional[str] = None


@dataclasses.dataclass
class Tally:
    """What the run has seen: files by status, how many changed, the report entries."""

    statuses: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    changed: int = 0
    entries: List[dict] = dataclasses.field(default_factory=list)

    def add(self, result: FileResult) -> None:
        """Count ``result`` (after anything done to it while writing)."""
        self.statuses[result.status] += 1
        self.changed += result.changed
        self.entries.append(result.to_json())

    def summary(self) -> Dict[str, int]:
        """Counts for the report: all files, changed files, and files per status."""
        counts = {"files": len(self.entries), "changed": self.changed}
        counts.update((status, self.statuses[status]) for status in STATUSES)
        return counts

    def summary_line(self) -> str:
        """The one line printed at the end of a run; its wording is stable."""
        files, errors = len(self.entries), self.statuses["error"]
        return (
            f"{PROG}: {files} file{'s' * (files != 1)} checked, "
            f"{self.statuses['migrated']} migrated, {self.statuses['partial']} partial, "
            f"{errors} error{'s' * (errors != 1)}, {self.statuses['unchanged']} unchanged"
        )

    def exit_code(self, check: bool) -> int:
        """2 if any file is in error, else 1 if any is partial or (``check``) changed, else 0."""
        if self.statuses["error"]:
            return 2
        if self.statuses["partial"] or (check and self.changed):
            return 1
        return 0


# ----------------------------------------------------------------------------- files


def collect_jobs(
    paths: Sequence[str], excludes: Sequence[str], skip_folders: FrozenSet[str] = frozenset()
) -> List[Job]:
    """The files named by ``paths``: in argument order, each folder's files sorted by path.

    A PATH that is not a folder is taken as a file whatever its name (a missing one is
    reported as unreadable when processed). ``--exclude`` globs and the folder rules only
    apply below a folder PATH. Folders whose real path is in ``skip_folders`` are not
    entered. A file reached twice is kept once, at its first place.
    """
    jobs: List[Job] = []
    seen = set()
    for root in paths:
        if os.path.isdir(root):
            found = _walk(root, excludes, skip_folders)
        else:
            found = [Job(root, os.path.basename(root))]
        for job in found:
            key = os.path.abspath(job.path)
            if key not in seen:
                seen.add(key)
                jobs.append(job)
    return jobs


def _walk(root: str, excludes: Sequence[str], skip_folders: FrozenSet[str]) -> List[Job]:
    """The ``*.py`` files below folder ``root``, sorted by their path relative to it
    (compared folder by folder, so ``a/z.py`` comes before ``a.py``).

    A folder that cannot be listed becomes a job carrying the reason, so it is reported.
    """
    found: List[Job] = []

    def unlistable(err: OSError) -> None:
        folder = os.fspath(err.filename)
        reason = err.strerror or str(err)
        found.append(Job(os.path.normpath(folder), os.path.relpath(folder, root), reason))

    for folder, subfolders, names in os.walk(root, onerror=unlistable):
        rel_folder = os.path.relpath(folder, root)
        subfolders[:] = [
            name for name in subfolders
            if not _skip_folder(folder, name, _join_rel(rel_folder, name), excludes, skip_folders)
        ]
        for name in names:
            rel = _join_rel(rel_folder, name)
            if name.endswith(".py") and not _excluded(rel, name, excludes):
                found.append(Job(os.path.normpath(os.path.join(folder, name)), rel))
    found.sort(key=lambda job: job.rel.split(os.sep))
    return found


def _join_rel(rel_folder: str, name: str) -> str:
    """``name`` inside the folder at relative path ``rel_folder`` (``.`` for the root)."""
    return name if rel_folder == os.curdir else os.path.join(rel_folder, name)


def _excluded(rel: str, name: str, excludes: Sequence[str]) -> bool:
    """True if an ``--exclude`` glob matches ``rel`` (with ``/`` separators) or ``name``."""
    posix_rel = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatch(posix_rel, glob) or fnmatch.fnmatch(name, glob) for glob in excludes)


def _skip_folder(
    parent: str, name: str, rel: str, excludes: Sequence[str], skip_folders: FrozenSet[str]
) -> bool:
    """True for a folder not to enter: hidden, ``venv``, ``__pycache__``, ``site-packages``,
    any folder holding ``pyvenv.cfg`` (a virtualenv), an excluded one, or one in
    ``skip_folders`` (real paths)."""
    full = os.path.join(parent, name)
    return (
        name.startswith(".")
        or name in _SKIPPED_FOLDER_NAMES
        or os.path.exists(os.path.join(full, "pyvenv.cfg"))
        or _excluded(rel, name, excludes)
        or (bool(skip_folders) and os.path.realpath(full) in skip_folders)
    )


def read_source(path: str) -> bytes:
    """The bytes of ``path``; raises OSError when it cannot be read."""
    with open(path, "rb") as handle:
        return handle.read()


def write_atomically(target: str, text: str, mode: int) -> None:
    """Make ``target`` hold exactly ``text`` (UTF-8) with permission bits ``mode``.

    Missing parent folders are created. The text goes to a temporary file next to
    ``target``, is flushed to disk, then renamed over it: readers see the old file or the
    new one, never a mix. On any failure ``target`` is left as it was, the temporary file
    is removed and the exception propagates.
    """
    folder = os.path.dirname(target) or os.curdir
    os.makedirs(folder, exist_ok=True)
    prefix = f".{os.path.basename(target)}."
    descriptor, temporary = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=".tmp")
    try:
        with open(descriptor, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


# ------------------------------------------------------------------------- migration


def migrate_text(text: str, path: str, engine: Engine, exact: bool) -> FileResult:
    """Migrate one file's ``text``; never raises.

    Text without an AMP marker is returned unchanged without calling the engine. If the
    engine raises, or its changed text does not compile, the file comes back unchanged
    with an RPM901 error.
    """
    if not might_use_amp(text):
        return FileResult(path, text, text)
    try:
        result = engine(text, path=path, exact=exact)
    except Exception as err:  # noqa: BLE001 - a bug in one file must not end the run
        message = (
            f"migration failed ({type(err).__name__}: {err}); "
            "file left unchanged (please report this)"
        )
        return _left_unchanged(FileResult(path, text, text), message)
    if result.changed and not _compiles(result.migrated, path):
        return _left_unchanged(result, COMPILE_FAILURE)
    return result


def migrate_bytes(data: bytes, path: str, engine: Engine, exact: bool) -> FileResult:
    """Decode ``data`` as UTF-8, line endings untouched, and migrate it; never raises.

    Data that is not UTF-8 gives an RPM903 error at the first bad byte.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_start = data.rfind(b"\n", 0, err.start) + 1
        line, col = data.count(b"\n", 0, err.start) + 1, err.start - line_start + 1
        message = f"file is not UTF-8 ({err.reason}); file skipped"
        return _not_processed(Diagnostic(path, line, col, "RPM903", message))
    return migrate_text(text, path, engine, exact)


def migrate_job(job: Job, engine: Engine, exact: bool) -> FileResult:
    """Read and migrate one file; never raises (runs in the worker processes).

    A file that cannot be read gives an RPM902 error at 1:1.
    """
    problem = job.problem
    if problem is None:
        try:
            data = read_source(job.path)
        except OSError as err:
            problem = err.strerror or str(err)
        else:
            return migrate_bytes(data, job.path, engine, exact)
    message = f"file could not be read: {problem}"
    return _not_processed(Diagnostic(job.path, 1, 1, "RPM902", message))


def migrate_stdin(engine: Engine, exact: bool) -> FileResult:
    """Read all of stdin and migrate it as ``<stdin>`` (see :func:`migrate_bytes`)."""
    buffer = getattr(sys.stdin, "buffer", None)
    if buffer is None:  # stdin replaced by a text stream: it is already decoded
        return migrate_text(sys.stdin.read(), STDIN_PATH, engine, exact)
    return migrate_bytes(buffer.read(), STDIN_PATH, engine, exact)


def run_jobs(
    jobs: Sequence[Job], worker: Callable[[Job], FileResult], processes: int
) -> Iterator[FileResult]:
    """``worker``'s result for each job, in job order: computed in this process when
    ``processes`` is 1, else in that many worker processes (``worker`` must pickle)."""
    if processes == 1 or len(jobs) < 2:
        yield from map(worker, jobs)
        return
    processes = min(processes, len(jobs))
    with concurrent.futures.ProcessPoolExecutor(max_workers=processes) as pool:
        yield from pool.map(worker, jobs, chunksize=max(1, len(jobs) // (4 * processes)))


def _compiles(text: str, path: str) -> bool:
    """True if Python accepts ``text`` as a module (a leading BOM is ignored, as for files)."""
    try:
        compile(text[1:] if text.startswith("\ufeff") else text, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError):
        return False
    return True


def _not_processed(error: Diagnostic) -> FileResult:
    """The result for a file that could not be processed: no text, just ``error``."""
    return FileResult(error.path, "", "", diagnostics=[error])


def _left_unchanged(result: FileResult, message: str) -> FileResult:
    """``result`` with its changes dropped and an RPM901 error ``message`` at 1:1 added."""
    error = Diagnostic(result.path, 1, 1, "RPM901", message)
    return dataclasses.replace(
        result, migrated=result.original, rewrites=[], diagnostics=[*result.diagnostics, error]
    )


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


def emit(text: str) -> None:
    """Write ``text`` to stdout as UTF-8 with its line endings untouched."""
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is None:
        sys.stdout.write(text)
        return
    buffer.write(text.encode("utf-8"))
    buffer.flush()


def deliver(job: Job, result: FileResult, options: argparse.Namespace) -> FileResult:
    """Put the migrated text where the mode says and return the final result.

    For ``-`` the text goes to stdout (unless ``--diff`` or ``--check``). With ``-w`` or
    ``-o`` a changed file that is not in error is written atomically, with the source's
    permission bits; if that fails, nothing is half-written and the result gains an
    RPM902 error.
    """
    if options.stdin:
        if not (options.diff or options.check):
            emit(result.migrated)
        return result
    if not (options.write or options.output) or not result.changed or result.status == "error":
        return result
    target = os.path.realpath(job.path) if options.write else os.path.join(options.output, job.rel)
    try:
        write_atomically(target, result.migrated, stat.S_IMODE(os.stat(job.path).st_mode))
    except OSError as err:
        message = (
            f"migrated text could not be written to {target} ({err.strerror or err}); "
            "file left unchanged"
        )
        error = Diagnostic(result.path, 1, 1, "RPM902", message)
        return dataclasses.replace(result, diagnostics=[*result.diagnostics, error])
    return result


def show(result: FileResult, options: argparse.Namespace) -> None:
    """Print ``result``: its diagnostics to stderr (info ones not with ``-q``), its diff
    to stdout when the mode shows diffs, and with ``-v`` its status to stderr."""
    for diagnostic in result.diagnostics:
        if not (options.quiet and diagnostic.is_info):
            print(diagnostic.format(), file=sys.stderr)
    if options.show_diff and result.changed:
        emit(unified_diff(result))
    if options.verbose:
        print(f"{result.path}: {result.status}", file=sys.stderr)


def write_report(path: str, tally: Tally) -> None:
    """Write the JSON report (version 1) of ``tally`` to ``path``; raises OSError."""
    report = {"version": 1, "files": tally.entries, "summary": tally.summary()}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(report, handle, indent=2)
        handle.write("\n")


# ---------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``roundpipe-migrate``."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Rewrite torch.amp / apex mixed-precision training scripts into the "
        "RoundPipe form.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "paths", nargs="+", metavar="PATH",
        help="file or folder to migrate (a folder: every *.py below it); '-' for stdin",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("-w", "--write", action="store_true", help="rewrite changed files in place")
    mode.add_argument(
        "-o", "--output-dir", dest="output", metavar="DIR",
        help="write changed files to DIR, mirroring their paths; originals untouched",
    )
    mode.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any file would change"
    )
    parser.add_argument(
        "--diff", action="store_true", help="print the diff also with -w, -o or --check"
    )
    parser.add_argument(
        "--exact", action="store_true",
        help="emit step(..., is_async=False) and update(is_async=False) so the migrated "
        "script reproduces the original's numbers",
    )
    parser.add_argument(
        "--report", metavar="FILE.json", help="write a JSON report of every file processed"
    )
    parser.add_argument(
        "-j", "--jobs", type=_positive_int, default=1, metavar="N",
        help="process files in N worker processes (default 1: in this process)",
    )
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB",
        help="skip files and folders below a folder PATH whose relative path or name "
        "matches GLOB (repeatable)",
    )
    talk = parser.add_mutually_exclusive_group()
    talk.add_argument(
        "-q", "--quiet", action="store_true", help="no summary line, no info (RPM3xx) diagnostics"
    )
    talk.add_argument(
        "-v", "--verbose", action="store_true", help="also print each file's status"
    )
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """Parse and check ``argv``; adds ``stdin`` and ``show_diff`` to the options.

    Raises SystemExit (2 for a usage error, 0 after ``--help``) as argparse does.
    """
    parser = build_parser()
    options = parser.parse_args(argv)
    options.stdin = "-" in options.paths
    if options.stdin and len(options.paths) > 1:
        parser.error("'-' (stdin) must be the only PATH")
    if options.stdin and (options.write or options.output):
        parser.error("'-' (stdin) cannot be combined with -w or -o")
    writes_elsewhere = options.stdin or options.write or options.output or options.check
    options.show_diff = options.diff or not writes_elsewhere
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``roundpipe-migrate`` on ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    try:
        options = parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error already printed by argparse
        return int(exc.code or 0)
    engine = ENGINE
    if options.stdin:
        jobs = [Job(STDIN_PATH, STDIN_PATH)]
        results: Iterator[FileResult] = iter([migrate_stdin(engine, options.exact)])
    else:
        skip = frozenset([os.path.realpath(options.output)]) if options.output else frozenset()
        jobs = collect_jobs(options.paths, options.exclude, skip)
        problem = _mirror_problem(jobs, options.output) if options.output else None
        if problem is not None:
            print(f"{PROG}: error: {problem}", file=sys.stderr)
            return 2
        worker = functools.partial(migrate_job, engine=engine, exact=options.exact)
        results = run_jobs(jobs, worker, options.jobs)
    tally = Tally()
    for job, result in zip(jobs, results):
        result = deliver(job, result, options)
        show(result, options)
        tally.add(result)
    code = tally.exit_code(options.check)
    if options.report:
        try:
            write_report(options.report, tally)
        except OSError as err:
            reason = f"report could not be written to {options.report}: {err}"
            print(f"{PROG}: error: {reason}", file=sys.stderr)
            code = 2
    if not options.quiet:
        print(tally.summary_line(), file=sys.stderr)
    return code
