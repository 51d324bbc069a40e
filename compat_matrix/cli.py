"""``roundpipe-parity``: run the compatibility matrix and write its report.

::

    roundpipe-parity [--device cpu|cuda|all] [--quick] [--scenario NAME ...] [--steps N] [--out DIR]

Exit status 0 iff no row diverged (skipped rows, with their reasons, do not fail the run).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Optional, Sequence

from .matrix import environment, run_matrix
from .report import write_reports
from .scenarios import scenario_names

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="roundpipe-parity",
        description="Train the same scenarios with torch's scaler, roundpipe's scaler and the "
        "RoundPipe runtime (and apex where present), compare them step by step, and write "
        "report.md, report.json and report.html.",
    )
    parser.add_argument("--device", choices=("cpu", "cuda", "all"), default="cpu")
    parser.add_argument("--quick", action="store_true", help="fewer steps and examples (for tests)")
    parser.add_argument("--scenario", action="append", choices=scenario_names(), metavar="NAME",
                        help="run only this scenario (repeatable; examples are then left out)")
    parser.add_argument("--steps", type=int, help="optimizer steps per scenario")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/parity"))
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.steps is not None and args.steps < 2:
        _parser().error("--steps must be at least 2")
    rows = run_matrix(args.device, args.quick, args.scenario, args.steps)
    command = "roundpipe-parity " + " ".join(argv if argv is not None else sys.argv[1:])
    data = write_reports(args.out, rows, environment(), command.strip())
    summary = data["summary"]
    print(f"roundpipe-parity: {len(rows)} rows: " + ", ".join(f"{n} {v}" for v, n in summary.items())
          + f"; report in {args.out}/report.md", file=sys.stderr)
    for row in rows:
        if row["verdict"] == "diverged":
            print(f"DIVERGED {row['scenario']} {row['reference']} vs {row['subject']} ({row['device']}): "
                  f"{row['reason']}", file=sys.stderr)
    return 1 if summary["diverged"] else 0


if __name__ == "__main__":
    sys.exit(main())
