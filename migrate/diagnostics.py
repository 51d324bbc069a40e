"""What roundpipe-migrate says about a file: rewrites done, diagnostics, the file's status.

Diagnostic codes are stable (tools and docs refer to them); the message says what was
found, why it was left alone and what to do. Printed as ``path:line:col: RPMnnn message``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List

from .changes import Change, line_changes
from .codes import REGISTRY

__all__ = ["CODES", "Diagnostic", "Rewrite", "FileResult"]

#: code -> one-line summary (the full documentation is :data:`migrate.codes.REGISTRY`)
CODES: Dict[str, str] = {code: entry.summary for code, entry in REGISTRY.items()}


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
    wrapped_models: List[str] = field(default_factory=list)  # names now bound to RoundPipe models
    # classes whose constructions the migration followed for what they hand the constructor
    # (migrate.handed_in); a result of files migrated as one (migrate.joined_classes): the group's
    handed_classes: List[str] = field(default_factory=list)

    @property
    def changes(self) -> List[Change]:
        """Where the text changed: inserted, removed, replaced and moved line ranges, with
        original and new line numbers (see :mod:`migrate.changes`)."""
        return line_changes(self.original, self.migrated) if self.changed else []

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
                {"line": d.line, "col": d.col, "code": d.code, "message": d.message} for d in self.diagnostics
            ],
        }
