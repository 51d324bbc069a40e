"""What roundpipe-migrate says about a file: rewrites done, diagnostics, the file's status.

Diagnostic codes are stable (tools and docs refer to them); the message says what was
found, why it was left alone and what to do. Printed as ``path:line:col: RPMnnn message``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

__all__ = ["CODES", "Diagnostic", "Rewrite", "FileResult"]

CODES: Dict[str, str] = {
    # torch.amp scripts: left untouched
    "RPM101": "model wrapped in DistributedDataParallel/DataParallel",
    "RPM102": "optimizer step with a closure",
    "RPM103": "backward with create_graph=True",
    "RPM104": "GradScaler used where its training step cannot be followed",
    "RPM105": "GradScaler kept in an attribute or container",
    "RPM106": "training step not recognised",
    "RPM107": "several models, optimizers or backward calls in one step",
    "RPM108": "model or optimizer not defined in this file",
    # apex scripts (roundpipe.compat)
    "RPM201": "apex construct with no RoundPipe equivalent",
    # informational
    "RPM301": "note on the migrated code",
    "RPM302": "several apex losses now share one scaler",
    # files that could not be processed
    "RPM901": "syntax error",
    "RPM902": "file could not be read or written",
    "RPM903": "file is not UTF-8",
    "RPM904": "internal error in roundpipe-migrate (please report it)",
    "RPM905": "not a regular Python file (FIFO, device, notebook); skipped unread",
}


@dataclass(frozen=True)
class Diagnostic:
    """One finding at ``path:line:col`` (1-based line, 1-based column)."""

    path: str
    line: int
    col: int
    code: str
    message: str

    def format(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: {self.code} {self.message}"

    @property
    def is_error(self) -> bool:
        """The file could not be processed at all (exit status 2)."""
        return self.code.startswith("RPM9")

    @property
    def is_info(self) -> bool:
        """Informational only: does not make the run exit 1."""
        return self.code.startswith("RPM3")


@dataclass(frozen=True)
class Rewrite:
    """One change made, for the report: where and what."""

    line: int
    description: str


@dataclass
class FileResult:
    """The outcome for one file. ``migrated == original`` when nothing was changed."""

    path: str
    original: str
    migrated: str
    rewrites: List[Rewrite] = field(default_factory=list)
    diagnostics: List[Diagnostic] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.migrated != self.original

    @property
    def status(self) -> str:
        """``error`` (not processed), ``partial`` (AMP usage left with a diagnostic),
        ``migrated`` (changed, nothing left) or ``unchanged`` (nothing to do)."""
        if any(d.is_error for d in self.diagnostics):
            return "error"
        if any(not d.is_info for d in self.diagnostics):
            return "partial"
        return "migrated" if self.changed else "unchanged"

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "status": self.status,
            "changed": self.changed,
            "rewrites": [{"line": r.line, "description": r.description} for r in self.rewrites],
            "diagnostics": [
                {"line": d.line, "col": d.col, "code": d.code, "message": d.message}
                for d in self.diagnostics
            ],
        }
