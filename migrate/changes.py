"""Every line-level change between a file's original and migrated text, for the report.

The rules record *what* they rewrote (:class:`~migrate.diagnostics.Rewrite`); this module
says *where*, in both texts: inserted, removed and replaced line ranges, and removed lines
that reappear elsewhere (moved, e.g. loss statements into a loss function). Line numbers
are 1-based and inclusive; ``original`` ranges refer to the input, ``new`` ranges to the
output.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import List, Optional, Tuple

__all__ = ["Change", "line_changes"]

LineRange = Tuple[int, int]


@dataclass(frozen=True)
class Change:
    """One changed stretch of lines: ``kind`` is inserted, removed, replaced or moved."""

    kind: str
    original: Optional[LineRange]
    new: Optional[LineRange]

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "original_lines": list(self.original) if self.original else None,
            "new_lines": list(self.new) if self.new else None,
        }


def line_changes(original: str, migrated: str) -> List[Change]:
    """The changes turning ``original`` into ``migrated``, in original order."""
    before, after = original.splitlines(), migrated.splitlines()
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    changes: List[Change] = []
    added: List[LineRange] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        old = (i1 + 1, i2) if i2 > i1 else None
        new = (j1 + 1, j2) if j2 > j1 else None
        if new is not None:
            added.append(new)
        kind = {"insert": "inserted", "delete": "removed", "replace": "replaced"}[tag]
        changes.append(Change(kind, old, new))
    return [_as_move(change, before, after, added) for change in changes]


def _as_move(change: Change, before: List[str], after: List[str], added: List[LineRange]) -> Change:
    """A removed stretch whose lines all reappear (re-indented) in one added stretch."""
    if change.kind != "removed" or change.original is None:
        return change
    start, end = change.original
    lines = [line.strip() for line in before[start - 1 : end] if line.strip()]
    for new_start, new_end in added:
        text = [line.strip() for line in after[new_start - 1 : new_end]]
        if lines and all(line in text for line in lines):
            return Change("moved", change.original, (new_start, new_end))
    return change
