"""Benchmark: what the migration engine costs per AMP file, next to a bare libcst parse.

    python bench/migrate_engine.py [--rounds 7] [--sizes 50,500,5000]

Run from the repository root (``PYTHONPATH=.`` if the project is not installed). Two rows:

* per AMP file: every ``examples/amp_*.py`` and ``examples/apex_*.py`` script through
  :func:`migrate.project.migrate_project` (the project view included) and through the
  per-file engine :func:`migrate.engine.migrate_source`, each next to a bare
  ``libcst.parse_module`` of the same text (and parse + ``.code``);
* growth with file size: one file of about 50, 500, 5,000 lines made by repeating the
  training function of ``examples/amp_clipping.py`` (each copy with its own GradScaler,
  model and optimizer), through
  ``migrate_project``, next to a bare parse of it;
* a tree of ``--files`` files with ``--amp-share`` AMP scripts (built by ``bench/migrate.py``'s
  tree builders): ``roundpipe-migrate --check -q TREE`` in process, next to a bare libcst
  parse + ``.code`` of every file (the project aims at 0.5x or less).

Rounds are interleaved (bare, engine, bare, engine...) so that load changes hit both
sides alike; each ratio is the median of the per-round ratios, with their spread
(min-max). Times are this process's CPU time (``time.process_time``), which waiting for a
core on a loaded machine does not inflate; the machine's load (``os.getloadavg``) is
printed before and after. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import libcst

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from migrate.engine import migrate_source  # noqa: E402
from migrate.project import migrate_project  # noqa: E402

# The tree builders of bench/migrate.py (a file named like the package, so loaded by path).
_SPEC = importlib.util.spec_from_file_location("bench_migrate", REPO / "bench" / "migrate.py")
assert _SPEC is not None and _SPEC.loader is not None
trees = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = trees  # its dataclasses look their module up while it runs
_SPEC.loader.exec_module(trees)

#: Repeated to make files of a given size: a training loop with unscale_, clipping and step.
GROWTH_SCRIPT = REPO / "examples" / "amp_clipping.py"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds per row")
    parser.add_argument("--sizes", default="50,500,5000", help="lines of the generated files")
    parser.add_argument("--files", type=int, default=300, help="files in the mixed tree (0: no tree row)")
    parser.add_argument("--amp-share", type=float, default=0.1, help="fraction of AMP scripts in the tree")
    return parser.parse_args(argv)


def interleaved(sides: Dict[str, Callable[[], object]], rounds: int) -> Dict[str, List[float]]:
    """CPU seconds per round for each side, the sides run one after the other in every
    round (after one warm-up round)."""
    for run in sides.values():
        run()
    times: Dict[str, List[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, run in sides.items():
            start = time.process_time()
            run()
            times[name].append(time.process_time() - start)
    return times


def ratio_line(label: str, times: Dict[str, List[float]], side: str, base: str, per: int) -> str:
    ratios = [t / b for t, b in zip(times[side], times[base])]
    return (
        f"{label:34s} {statistics.median(times[side]) * 1000 / per:8.2f} ms  "
        f"{statistics.median(ratios):5.2f}x {base}  (spread {min(ratios):.2f}-{max(ratios):.2f})"
    )


def generated_file(lines: int) -> str:
    """``GROWTH_SCRIPT`` with its ``main()`` repeated (``main_0``, ``main_1``...) to about
    ``lines`` lines."""
    text = GROWTH_SCRIPT.read_text(encoding="utf-8")
    start, end = text.index("\n\ndef main():"), text.index("\n\nif __name__")
    header, function = text[:start], text[start:end]
    copies = max(1, round((lines - header.count("\n")) / function.count("\n")))
    return header + "".join(function.replace("def main():", f"def main_{index}():") for index in range(copies)) + "\n"


def load() -> str:
    return "load average %.2f %.2f %.2f" % os.getloadavg()


def main(argv: Sequence[str]) -> None:
    args = parse_args(argv)
    print(f"libcst {importlib.metadata.version('libcst')}, python {sys.version.split()[0]}, {load()}")
    scripts = sorted((REPO / "examples").glob("amp_*.py")) + sorted((REPO / "examples").glob("apex_*.py"))
    sources = {path.name: path.read_text(encoding="utf-8") for path in scripts}

    times = interleaved(
        {
            "parse": lambda: [libcst.parse_module(text) for text in sources.values()],
            "parse+code": lambda: [libcst.parse_module(text).code for text in sources.values()],
            "migrate_project": lambda: [migrate_project({name: text}) for name, text in sources.items()],
            "migrate_source": lambda: [migrate_source(text, name) for name, text in sources.items()],
        },
        args.rounds,
    )
    count = len(sources)
    print(f"\nper AMP file ({count} example scripts, {args.rounds} interleaved rounds; CPU ms per file)")
    print(ratio_line("bare parse", times, "parse", "parse", count))
    print(ratio_line("bare parse + code", times, "parse+code", "parse", count))
    print(ratio_line("migrate_project (project view)", times, "migrate_project", "parse", count))
    print(ratio_line("migrate_source (engine only)", times, "migrate_source", "parse", count))

    print("\ngrowth with file size (repeated training functions; CPU ms per file)")
    for lines in (int(size) for size in args.sizes.split(",")):
        text = generated_file(lines)
        name = f"generated_{lines}.py"
        rounds = max(3, args.rounds if lines <= 500 else 3)
        times = interleaved(
            {
                "parse": lambda: libcst.parse_module(text),
                "migrate_project": lambda: migrate_project({name: text}),
            },
            rounds,
        )
        result = migrate_project({name: text})[name]
        print(
            ratio_line(
                f"{text.count(chr(10)):6d} lines ({len(result.rewrites)} rewrites)",
                times,
                "migrate_project",
                "parse",
                1,
            )
        )
    if args.files:
        tree_row(args.files, args.amp_share, args.rounds)
    print(f"\n{load()}")


def tree_row(files: int, amp_share: float, rounds: int) -> None:
    amp_count = round(files * amp_share)
    with tempfile.TemporaryDirectory(prefix="rp-migrate-engine-") as scratch:
        tree = Path(scratch) / "mixed"
        paths = trees.write_amp_files(tree, amp_count) + trees.write_plain_files(tree, files - amp_count)
        times = interleaved(
            {
                "parse+code": lambda: trees.bare_libcst(paths),
                "--check": lambda: trees.run_cli_quietly(["--check", "-q", str(tree)]),
            },
            rounds,
        )
    print(f"\ntree of {files} files, {amp_count} AMP ({rounds} interleaved rounds; CPU ms per tree)")
    print(ratio_line("bare libcst parse + code", times, "parse+code", "parse+code", 1))
    print(ratio_line("roundpipe-migrate --check -q", times, "--check", "parse+code", 1))


if __name__ == "__main__":
    main(sys.argv[1:])
