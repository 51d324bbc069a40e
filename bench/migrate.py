"""Benchmark: what ``roundpipe-migrate`` costs on a repository, next to bare libcst.

    python bench/migrate.py [--files 300] [--amp-share 0.1] [--repeats 5] [--parallel-files 120]

Run from the repository root (``PYTHONPATH=.`` if the project is not installed). One
run builds a temporary tree of ``--files`` Python files, of which ``--amp-share`` are
the ``examples/amp_*.py`` training scripts (cycled, spread over a few subfolders) and
the rest plain modules copied from the interpreter's standard library (100 to 800
lines, none mentioning an AMP marker). It then prints, side by side:

* the whole-tree ``roundpipe-migrate --check -q TREE`` run, in process;
* "bare libcst" on the same tree: read, ``libcst.parse_module`` and ``.code`` per file;
* their ratio (the project aims at 0.5 or less, thanks to the text prefilter that
  skips files without AMP markers before parsing);
* ``migrate_source`` on the AMP files alone, in files per second;
* ``-j 1`` against ``-j 2`` on a tree of AMP files only, each run as a subprocess
  (``python -m migrate``) so that interpreter and worker start-up count for both.

In-process timings are the median of ``--repeats`` runs after one warm-up; the
subprocess timings the median of 3 after one warm-up. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.metadata
import itertools
import os
import platform
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Sequence, Tuple, TypeVar

import libcst

# This script shares its name with the package it measures, and Python puts the script's
# folder first on sys.path: put the repository root there instead so that
# ``import migrate`` finds the package.
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:] = [str(REPO)] + [entry for entry in sys.path if Path(entry or ".").resolve() != BENCH]

from migrate.cli import main as migrate_main  # noqa: E402
from migrate.engine import migrate_source  # noqa: E402
from migrate.prefilter import might_use_amp  # noqa: E402

T = TypeVar("T")
AMP_FOLDERS = ("training", "experiments/fp16", "scripts/legacy")
PLAIN_FOLDERS = ("core", "core/utils", "services", "services/io", "tools")
MIN_LINES, MAX_LINES = 100, 800
SUBPROCESS_REPEATS = 3


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The benchmark's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300, help="files in the mixed tree")
    parser.add_argument(
        "--amp-share", type=float, default=0.1, help="fraction of the tree that are AMP scripts"
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per in-process measure")
    parser.add_argument(
        "--parallel-files", type=int, default=120, help="AMP files in the -j 1 / -j 2 tree"
    )
    return parser.parse_args(argv)


# ----------------------------------------------------------------------------- the trees


def amp_scripts() -> List[Path]:
    """The example AMP training scripts, sorted by name."""
    return sorted((REPO / "examples").glob("amp_*.py"))


def stdlib_modules() -> Iterator[Tuple[Path, str]]:
    """Standard-library sources of 100-800 lines that mention no AMP marker and compile.

    Test packages and ``site-packages`` are left out; files that are not UTF-8 or do not
    compile under this interpreter are skipped. Yields ``(path, text)`` in sorted order.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        parts = set(path.relative_to(root).parts)
        if "site-packages" in parts or any(part.startswith(("test", "idle")) for part in parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            compile(text, str(path), "exec")
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            continue
        if MIN_LINES <= text.count("\n") <= MAX_LINES and not might_use_amp(text):
            yield path, text


def write_amp_files(tree: Path, count: int) -> List[Path]:
    """Write ``count`` copies of the AMP examples (cycled) into subfolders of ``tree``."""
    scripts = amp_scripts()
    written = []
    for index in range(count):
        source = scripts[index % len(scripts)]
        folder = tree / AMP_FOLDERS[index % len(AMP_FOLDERS)]
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{source.stem}_{index:03d}.py"
        shutil.copyfile(source, target)
        written.append(target)
    return written


def write_plain_files(tree: Path, count: int) -> List[Path]:
    """Write ``count`` marker-free standard-library modules into subfolders of ``tree``.

    Sources are taken in order and reused from the start when the standard library has
    fewer than ``count`` of them.
    """
    sources = list(itertools.islice(stdlib_modules(), count))
    if not sources:
        raise SystemExit("no suitable standard-library modules found")
    written = []
    for index in range(count):
        source, text = sources[index % len(sources)]
        folder = tree / PLAIN_FOLDERS[index % len(PLAIN_FOLDERS)]
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{source.stem}_{index:03d}.py"
        target.write_text(text, encoding="utf-8", newline="")
        written.append(target)
    return written


# ----------------------------------------------------------------------------- timing


def median_time(action: Callable[[], T], repeats: int) -> Tuple[float, T]:
    """Median wall time in seconds of ``repeats`` calls of ``action`` (after one untimed
    warm-up call), and what the last call returned."""
    result = action()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def run_cli_quietly(argv: List[str]) -> int:
    """``migrate.cli.main(argv)`` with stdout and stderr sent to the null device."""
    with open(os.devnull, "w", encoding="utf-8") as sink:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return migrate_main(argv)


def bare_libcst(paths: Sequence[Path]) -> None:
    """Read, parse and regenerate every file with libcst alone (no metadata)."""
    for path in paths:
        with open(path, encoding="utf-8", newline="") as handle:
            libcst.parse_module(handle.read()).code


def migrate_texts(sources: Sequence[Tuple[str, str]]) -> None:
    """Run the migration engine on every ``(path, text)`` pair."""
    for path, text in sources:
        migrate_source(text, path)


def subprocess_command(tree: Path, processes: int) -> List[str]:
    """The ``python -m migrate --check -q -j N TREE`` command line."""
    return [sys.executable, "-m", "migrate", "--check", "-q", "-j", str(processes), str(tree)]


def run_subprocess(command: List[str]) -> int:
    """Run ``command`` from the repository root, with it importable and the output
    discarded; return the exit status."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        check=False,
    ).returncode


# ----------------------------------------------------------------------------- report


def machine_facts() -> List[str]:
    """Python version, CPU count and load average, one fact a line."""
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        f"python      {platform.python_version()} ({platform.python_implementation()}) on {platform.platform()}",
        f"libcst      {importlib.metadata.version('libcst')}",
        f"cpu_count   {os.cpu_count()}",
        f"loadavg     {load} (1, 5, 15 min)",
    ]


def print_table(rows: Sequence[Tuple[str, str]]) -> None:
    """Print ``(label, value)`` rows as two aligned columns."""
    width = max(len(label) for label, _ in rows)
    print(f"{'measure':<{width}}  value")
    print(f"{'-' * width}  {'-' * 28}")
    for label, value in rows:
        print(f"{label:<{width}}  {value}")


def main(argv: Sequence[str]) -> None:
    """Build the trees, take every measure and print the report."""
    options = parse_args(argv)
    amp_count = round(options.files * options.amp_share)
    plain_count = options.files - amp_count
    print("roundpipe-migrate benchmark")
    print(f"command     {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(*machine_facts(), sep="\n")
    with tempfile.TemporaryDirectory(prefix="rp-migrate-bench-") as scratch:
        mixed = Path(scratch) / "mixed"
        amp_paths = write_amp_files(mixed, amp_count)
        all_paths = amp_paths + write_plain_files(mixed, plain_count)
        amp_only = Path(scratch) / "amp_only"
        write_amp_files(amp_only, options.parallel_files)
        lines = sum(path.read_text(encoding="utf-8").count("\n") for path in all_paths)
        print(
            f"mixed tree  {len(all_paths)} files ({amp_count} AMP, {plain_count} plain), "
            f"{lines} lines; AMP-only tree {options.parallel_files} files"
        )
        print()

        cli_argv = ["--check", "-q", str(mixed)]
        cli_time, cli_code = median_time(lambda: run_cli_quietly(cli_argv), options.repeats)
        cst_time, _ = median_time(lambda: bare_libcst(all_paths), options.repeats)
        amp_sources = [(str(path), path.read_text(encoding="utf-8")) for path in amp_paths]
        engine_time, _ = median_time(lambda: migrate_texts(amp_sources), options.repeats)
        wall, codes = {}, {}
        for processes in (1, 2):
            command = subprocess_command(amp_only, processes)
            wall[processes], codes[processes] = median_time(
                functools.partial(run_subprocess, command), SUBPROCESS_REPEATS
            )

    ratio = cli_time / cst_time
    verdict = "meets" if ratio <= 0.5 else "misses"
    print_table([
        (f"a. roundpipe-migrate --check -q TREE (in process, exit {cli_code}, expect 1)",
         f"{cli_time * 1000:9.1f} ms"),
        ("b. bare libcst: read + parse_module + .code, all files", f"{cst_time * 1000:9.1f} ms"),
        ("c. ratio a / b (target <= 0.5)", f"{ratio:9.3f}  ({verdict} target)"),
        (f"d. migrate_source on the {amp_count} AMP files",
         f"{amp_count / engine_time:9.1f} files/s ({engine_time * 1000:.1f} ms)"),
        (f"e. -j 1 subprocess, {options.parallel_files} AMP files (exit {codes[1]})",
         f"{wall[1] * 1000:9.1f} ms"),
        (f"   -j 2 subprocess, {options.parallel_files} AMP files (exit {codes[2]})",
         f"{wall[2] * 1000:9.1f} ms"),
        ("   speed-up -j 2 over -j 1", f"{wall[1] / wall[2]:9.2f} x"),
    ])
    print()
    print(f"a, b, d: median of {options.repeats} after one warm-up; "
          f"e: median of {SUBPROCESS_REPEATS} after one warm-up")
    print(f"e command: {' '.join(subprocess_command(Path('AMP_TREE'), 2))} (and -j 1)")


if __name__ == "__main__":
    main(sys.argv[1:])
