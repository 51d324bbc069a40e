"""Migrate one file's source text: parse, apply the torch.amp and apex rules, check.

Entry point for the command line and the tests: :func:`migrate_source`. It never raises
for bad input: a file that cannot be parsed comes back unchanged with an RPM9xx diagnostic.
It never imports torch.
"""

from __future__ import annotations

import libcst as cst

from .diagnostics import Diagnostic, FileResult
from .prefilter import might_use_amp

__all__ = ["migrate_source"]


def migrate_source(source: str, path: str = "<stdin>", exact: bool = False) -> FileResult:
    """Return the migrated text of ``source`` with what was rewritten and what was not.

    Args:
        source: the file's text.
        path: used in diagnostics and the report only.
        exact: emit ``step(..., is_async=False)`` and ``update(is_async=False)`` so the
            migrated script reproduces the original's numbers.
    """
    result = FileResult(path=path, original=source, migrated=source)
    if not might_use_amp(source):
        return result
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as err:
        result.diagnostics.append(
            Diagnostic(path, err.raw_line, err.raw_column + 1, "RPM901",
                       f"syntax error, file skipped: {err.message}")
        )
        return result
    del module  # rules land here
    return result
