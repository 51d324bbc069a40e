"""Benchmark: what ``roundpipe-migrate`` costs, next to bare libcst, in interleaved rounds.

    python bench/migrate.py [--files 300] [--amp-share 0.1] [--rounds 5]
                            [--sizes 100,1000,3000] [--parallel-files 120]

Run from the repository root (``PYTHONPATH=.`` if the project is not installed). Trees
are built in a temporary folder: ``--amp-share`` of their files are the
``examples/amp_*.py`` training scripts (cycled, spread over a few subfolders), the rest
plain modules copied from the interpreter's standard library (100 to 800 lines, none
mentioning an AMP marker). Every row is a ratio of two things measured side by side:
each round runs both, alternately, and the row prints the median of the per-round ratios
with their spread (min-max) and the load average when the row was finished.

* start-up: ``python -m migrate --help`` against ``python -c pass`` (subprocesses, with
  byte-code caching on, in a scratch cache folder); target: --help <= 0.15 s;
* ``--check -q TREE`` in process against bare libcst (read, ``parse_module``, ``.code``)
  on the ``--files`` tree; target <= 0.5x;
* the engine per AMP file against a bare libcst parse + codegen of the same file
  (issue 14's target for the engine: <= 3x);
* growth: ``--check`` on trees of ``--sizes`` files (same AMP share), the cost per AMP
  file and per file, one round each;
* ``-j 2`` against ``-j 1`` (subprocesses, so interpreter and worker start-up count), on
  the ``--files`` tree and on ``--parallel-files`` AMP files alone; target >= 1.8x on two
  free cores.

Not part of the test suite. The figures depend on the load: read them with the load
average printed beside them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

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


@dataclasses.dataclass
class Row:
    """One line of the report: the median of ``samples``, their spread, the target, and
    the load average when the row was measured."""

    label: str
    samples: List[float]
    unit: str
    target: str = ""
    load: str = dataclasses.field(default_factory=lambda: load())

    def text(self) -> str:
        median = statistics.median(self.samples)
        spread = f"{min(self.samples):.3f}-{max(self.samples):.3f}"
        target = f"{self.target:<14}"
        return f"{median:9.3f} {self.unit:<8} spread {spread:<13} {target} load {self.load}"


def load() -> str:
    """The 1-minute load average, as ``uptime`` prints it."""
    return f"{os.getloadavg()[0]:.2f}"


def timed(action: Callable[[], T]) -> Tuple[float, T]:
    """Wall time in seconds of one call of ``action``, and what it returned."""
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def interleaved(
    first: Callable[[], object], second: Callable[[], object], rounds: int
) -> Tuple[List[float], List[float]]:
    """Times of ``first`` and ``second`` run alternately ``rounds`` times, after one
    untimed warm-up of each (which round goes first alternates too)."""
    first(), second()
    a: List[float] = []
    b: List[float] = []
    for index in range(rounds):
        pair = [(first, a), (second, b)]
        for action, samples in pair if index % 2 == 0 else pair[::-1]:
            samples.append(timed(action)[0])
    return a, b


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> List[float]:
    return [n / d for n, d in zip(numerators, denominators)]


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


def run_subprocess(command: List[str], env: Optional[Dict[str, str]] = None) -> int:
    """Run ``command`` from the repository root, with it importable and the output
    discarded; return the exit status."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run(
        command,
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    ).returncode


def migrate_command(tree: Path, processes: int) -> List[str]:
    """The ``python -m migrate --check -q -j N TREE`` command line."""
    return [sys.executable, "-m", "migrate", "--check", "-q", "-j", str(processes), str(tree)]


def build_tree(root: Path, files: int, amp_share: float) -> Tuple[List[Path], List[Path]]:
    """A tree of ``files`` files, ``amp_share`` of them AMP scripts: (AMP paths, all paths)."""
    amp_count = round(files * amp_share)
    amp_paths = write_amp_files(root, amp_count)
    return amp_paths, amp_paths + write_plain_files(root, files - amp_count)


# ----------------------------------------------------------------------------- measures


def startup_row(scratch: Path, rounds: int) -> Row:
    """``--help`` against a bare interpreter, with byte-code caching in ``scratch``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
    help_times, bare_times = interleaved(
        lambda: run_subprocess([sys.executable, "-m", "migrate", "--help"], env),
        lambda: run_subprocess([sys.executable, "-c", "pass"], env),
        rounds,
    )
    row = Row("roundpipe-migrate --help (s)", help_times, "s", "target <= 0.15")
    print(f"  python -c pass: median {statistics.median(bare_times):.3f} s")
    return row


def check_rows(tree: Path, amp_paths: List[Path], all_paths: List[Path], rounds: int) -> List[Row]:
    """``--check`` against bare libcst on the tree, and the engine per AMP file."""
    cli_times, cst_times = interleaved(
        lambda: run_cli_quietly(["--check", "-q", str(tree)]),
        lambda: bare_libcst(all_paths),
        rounds,
    )
    sources = [(str(path), path.read_text(encoding="utf-8")) for path in amp_paths]
    engine_times, amp_cst_times = interleaved(lambda: migrate_texts(sources), lambda: bare_libcst(amp_paths), rounds)
    count = len(amp_paths)
    return [
        Row(f"--check / bare libcst, {len(all_paths)} files", ratios(cli_times, cst_times), "x", "target <= 0.5"),
        Row("engine / bare libcst, per AMP file", ratios(engine_times, amp_cst_times), "x", "target <= 3"),
        Row("engine per AMP file (ms)", [t * 1000 / count for t in engine_times], "ms"),
    ]


def growth_rows(scratch: Path, sizes: Sequence[int], amp_share: float) -> List[Row]:
    """One ``--check`` round per tree size: cost per AMP file and per file."""
    rows = []
    for size in sizes:
        tree = scratch / f"size_{size}"
        amp_paths, all_paths = build_tree(tree, size, amp_share)
        seconds, _ = timed(lambda: run_cli_quietly(["--check", "-q", str(tree)]))
        rows.append(Row(f"--check {size} files: per AMP file (ms)", [seconds * 1000 / max(1, len(amp_paths))], "ms"))
        rows.append(Row(f"--check {size} files: per file (ms)", [seconds * 1000 / len(all_paths)], "ms"))
    return rows


def parallel_row(label: str, tree: Path, rounds: int) -> Row:
    """``-j 2`` against ``-j 1`` on ``tree``: the speed-up per round."""
    one, two = interleaved(
        lambda: run_subprocess(migrate_command(tree, 1)),
        lambda: run_subprocess(migrate_command(tree, 2)),
        rounds,
    )
    return Row(label, ratios(one, two), "x", "target >= 1.8")


# ----------------------------------------------------------------------------- report


def machine_facts() -> List[str]:
    """Python version, libcst version, CPU count and load average, one fact a line."""
    loads = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return [
        f"python      {platform.python_version()} ({platform.python_implementation()}) on {platform.platform()}",
        f"libcst      {importlib.metadata.version('libcst')}",
        f"cpu_count   {os.cpu_count()}",
        f"loadavg     {loads} (1, 5, 15 min) at the start",
    ]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The benchmark's options."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=300, help="files in the mixed tree")
    parser.add_argument("--amp-share", type=float, default=0.1, help="fraction of a tree that are AMP scripts")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per row")
    parser.add_argument("--sizes", default="100,1000,3000", help="tree sizes for the growth rows (comma list)")
    parser.add_argument("--parallel-files", type=int, default=120, help="files in the AMP-only -j tree")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> None:
    """Build the trees, take every measure and print the report."""
    options = parse_args(argv)
    print("roundpipe-migrate benchmark")
    print(f"command     {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(*machine_facts(), sep="\n")
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="rp-migrate-bench-") as folder:
        scratch = Path(folder)
        mixed = scratch / "mixed"
        amp_paths, all_paths = build_tree(mixed, options.files, options.amp_share)
        amp_only = scratch / "amp_only"
        write_amp_files(amp_only, options.parallel_files)
        print(
            f"mixed tree  {len(all_paths)} files ({len(amp_paths)} AMP); AMP-only tree {options.parallel_files} files"
        )
        rows.append(startup_row(scratch, options.rounds))
        rows.extend(check_rows(mixed, amp_paths, all_paths, options.rounds))
        for label, tree in [(f"{len(all_paths)}-file tree", mixed), (f"{options.parallel_files} AMP files", amp_only)]:
            rows.append(parallel_row(f"-j 2 speed-up, {label}", tree, options.rounds))
        sizes = [int(size) for size in options.sizes.split(",") if size]
        rows.extend(growth_rows(scratch, sizes, options.amp_share))
    width = max(len(row.label) for row in rows)
    print()
    for row in rows:
        print(f"{row.label:<{width}}  {row.text()}")
    print()
    print(f"ratios: median of {options.rounds} interleaved rounds after one warm-up each; growth rows: one round")


if __name__ == "__main__":
    main(sys.argv[1:])
