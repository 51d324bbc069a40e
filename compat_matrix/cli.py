"""``roundpipe-parity``: run the compatibility matrix and write its report.

::

    roundpipe-parity [--device cpu|cuda|all] [--quick] [--scenario NAME ...] [--steps N] [--out DIR]

Exit status 0 iff no row diverged (skipped rows, with their reasons, do not fail the run);
2 for a usage error, found before anything runs: ``--steps`` outside 2..MAX_STEPS, an empty
``--out``, or an ``--out`` folder that cannot be created or written.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
from typing import Optional, Sequence

from .matrix import environment, run_matrix
from .report import write_reports
from .scenarios import scenario_names

__all__ = ["main", "MAX_STEPS"]

MAX_STEPS = 10_000  # every runner keeps every step's parameters in memory for the comparison


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
    parser.add_argument("--steps", type=int, help=f"optimizer steps per scenario (2 to {MAX_STEPS})")
    parser.add_argument("--out", type=_out_folder, default=pathlib.Path("out/parity"))
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.steps is not None and not 2 <= args.steps <= MAX_STEPS:
        parser.error(f"--steps must be between 2 and {MAX_STEPS}, got {args.steps}")
    reason = _unwritable_reason(args.out)
    if reason is not None:
        parser.error(reason)
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
