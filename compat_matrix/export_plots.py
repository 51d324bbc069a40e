"""``python -m compat_matrix.export_plots REPORT.json DIR [--panel NAME ...]``: the plots of a
roundpipe-parity run as SVG files, the same panels report.html draws.

Each panel becomes ``DIR/NAME.svg``, NAME being ``DEVICE-SCENARIO-SUBJECT-KIND`` (KIND: scale,
scale-diff, loss or loss-diff), e.g. ``cpu-microbatches-exact-loss-diff``. Without
``--panel`` every panel of the report is written; the docs' plots are made with ``--panel``.
Exit status 0, or 2 for a bad report, an unknown panel name or another usage error.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
from typing import Any, Dict, Optional, Sequence

from .plots import standalone
from .report import row_panels, validate_report

__all__ = ["panel_files", "main"]


def _name_part(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-")


def panel_files(data: Dict[str, Any]) -> Dict[str, str]:
    """Every panel of a report.json as {NAME: the text of NAME.svg}, in the report's order."""
    files: Dict[str, str] = {}
    for row in data["rows"]:
        scenario = row["scenario"].removeprefix("example:")
        stem = "-".join(_name_part(part) for part in (row["device"], scenario.removesuffix(".py"), row["subject"]))
        panels, _ = row_panels(row, prefix=f"{scenario}, {row['subject']} — ")
        for kind, svg in panels:
            name = f"{stem}-{kind}"
            if name in files:
                raise ValueError(f"two rows give the panel name {name!r}")
            files[name] = standalone(svg)
    return files


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m compat_matrix.export_plots",
        description="Write the plots of a roundpipe-parity report.json as SVG files, one per panel, "
        "named DEVICE-SCENARIO-SUBJECT-KIND.svg (KIND: scale, scale-diff, loss, loss-diff).",
    )
    parser.add_argument("report", type=pathlib.Path, metavar="REPORT.json", help="a report.json of roundpipe-parity")
    parser.add_argument("out", type=pathlib.Path, metavar="DIR", help="folder for the files, created if missing")
    parser.add_argument(
        "--panel",
        action="append",
        metavar="NAME",
        help="write only this panel (its file name without .svg); repeatable (default: every panel of the report)",
    )
    args = parser.parse_args(argv)
    try:
        data = json.loads(args.report.read_text(encoding="utf-8"))
        validate_report(data)
        files = panel_files(data)
    except (OSError, ValueError) as error:  # json.JSONDecodeError is a ValueError
        parser.error(f"{args.report}: {error}")
    unknown = [name for name in args.panel or () if name not in files]
    if unknown:
        parser.error(
            f"no panel named {', '.join(unknown)} in {args.report}; without --panel, all {len(files)} are written"
        )
    chosen = args.panel or list(files)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in chosen:
        (args.out / f"{name}.svg").write_text(files[name], encoding="utf-8")
    print(f"export_plots: wrote {len(chosen)} SVG file(s) to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
