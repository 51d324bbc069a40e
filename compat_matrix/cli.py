"""``roundpipe-parity``: run the compatibility matrix and write its report.

::

    roundpipe-parity [--device cpu|cuda|all] [--quick] [--scenario NAME ...] [--steps N] [--out DIR]

Exit status 0 iff no row diverged (skipped rows, with their reasons, do not fail the run),
1 when a row diverged, 2 for a usage error, found before anything runs: ``--steps`` outside
2..MAX_STEPS, an empty ``--out``, or an ``--out`` folder that cannot be created or written.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import Optional, Sequence

import torch

from .apex_column import APEX_SCENARIOS
from .matrix import QUICK_EXAMPLES, QUICK_STEPS, environment, run_matrix
from .progress import Progress
from .report import REPORT_FILES, write_reports
from .scenarios import SCENARIOS

__all__ = ["main", "MAX_STEPS"]

ALL_SCENARIOS = SCENARIOS + APEX_SCENARIOS  # the apex-only rows run where apex (or its stand-in) imports

MAX_STEPS = 10_000  # every runner keeps every step's parameters in memory for the comparison


def _epilog() -> str:
    width = max(len(s.name) for s in ALL_SCENARIOS)
    scenarios = "\n".join(f"  {s.name:<{width}}  {s.description}" for s in ALL_SCENARIOS)
    return (
        f"scenarios (for --scenario):\n{scenarios}\n\n"
        "Without --scenario, the example scripts examples/amp_*.py and examples/apex_*.py run too,\n"
        f"each original against its migrated forms (--quick: {len(QUICK_EXAMPLES)} of them).\n\n"
        "exit status:\n"
        "  0  no row diverged (skipped rows, each with its reason, do not fail the run)\n"
        "  1  at least one row diverged (each is listed on stderr)\n"
        "  2  usage error, found before anything runs (unknown option or scenario, a bad value,\n"
        f"     --steps outside 2..{MAX_STEPS}, an --out folder that cannot be written)\n"
    )


def _parser() -> argparse.ArgumentParser:
    steps = sorted({s.steps for s in SCENARIOS})
    parser = argparse.ArgumentParser(
        prog="roundpipe-parity",
        description="Train the same seeded scenarios with torch's GradScaler, roundpipe's scaler and\n"
        "the RoundPipe runtime (and apex where present), compare them step by step, and\n"
        "write report.md, report.json and report.html.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda", "all"),
        default="cpu",
        help="where to train: cpu, cuda, or all (both); without CUDA the cuda rows "
        "are reported as skipped (default: cpu)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"{QUICK_STEPS} steps per scenario and {len(QUICK_EXAMPLES)} example scripts, "
        "a short run for tests and a first look (default: off, the full matrix)",
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[s.name for s in ALL_SCENARIOS],
        metavar="NAME",
        help="run only this scenario; repeatable; the example scripts are then left out "
        "(default: every scenario, listed below)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help=f"optimizer steps per scenario, 2 to {MAX_STEPS} (default: each scenario's own, "
        f"{'/'.join(map(str, steps))}; {QUICK_STEPS} with --quick)",
    )
    parser.add_argument(
        "--out",
        type=_out_folder,
        default=pathlib.Path("out/parity"),
        metavar="DIR",
        help="folder for report.md, report.json and report.html, created if missing (default: out/parity)",
    )
    return parser


def _out_folder(text: str) -> pathlib.Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("the report folder must not be empty")
    return pathlib.Path(text)


def _unwritable_reason(out: pathlib.Path) -> Optional[str]:
    """Why the reports could not be written to ``out`` (creating it if needed), or None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as err:
        return f"cannot write the reports to {str(out)!r}: {err.strerror or err}"
    return None


def _cuda_note(device: str) -> Optional[str]:
    if device == "cpu" or torch.cuda.is_available():
        return None
    build = "a CPU-only torch build" if torch.version.cuda is None else f"torch built for CUDA {torch.version.cuda}"
    rest = "the CUDA rows are reported as skipped" + ("; the CPU rows run" if device == "all" else "")
    return f"roundpipe-parity: --device {device}: CUDA is not available on this machine ({build}); {rest}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps is not None and not 2 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be between 2 and {MAX_STEPS}, got {args.steps}")
    reason = _unwritable_reason(args.out)
    if reason is not None:
        parser.error(reason)
    note = _cuda_note(args.device)
    if note:
        print(note, file=sys.stderr)
    progress = Progress(sys.stderr)
    try:
        rows = run_matrix(args.device, args.quick, args.scenario, args.steps, progress)
    finally:
        progress.close()
    command = "roundpipe-parity " + " ".join(argv if argv is not None else sys.argv[1:])
    data = write_reports(args.out, rows, environment(), command.strip())
    summary = data["summary"]
    for row in rows:
        if row["verdict"] == "diverged":
            print(
                f"DIVERGED {row['scenario']} {row['reference']} vs {row['subject']} ({row['device']}): {row['reason']}",
                file=sys.stderr,
            )
    print(f"roundpipe-parity: {len(rows)} rows: " + ", ".join(f"{n} {v}" for v, n in summary.items()), file=sys.stderr)
    print("roundpipe-parity: wrote " + ", ".join(str(args.out / name) for name in REPORT_FILES), file=sys.stderr)
    return 1 if summary["diverged"] else 0


if __name__ == "__main__":
    sys.exit(main())
