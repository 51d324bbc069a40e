"""The cheap text test that decides whether a file is parsed at all.

A file that mentions none of the markers below cannot contain anything roundpipe-migrate
rewrites, so it is skipped without parsing (most files of a repository).
"""

from __future__ import annotations

import re

__all__ = ["might_use_amp"]

_MARKERS = re.compile(r"GradScaler|scale_loss|\bapex\b|amp\.initialize|FP16_Optimizer|amp_handle")


def might_use_amp(text: str) -> bool:
    """True if ``text`` mentions a GradScaler or apex amp marker."""
    return _MARKERS.search(text) is not None
