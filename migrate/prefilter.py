"""The cheap text tests that decide which files the engine looks at.

A file that mentions none of the markers below cannot contain anything roundpipe-migrate
rewrites, so it is not parsed by libcst (most files of a repository). A file that such a
candidate imports is looked at too, whatever its text: it may build the model, the
optimizer or the scaler that the candidate's training step uses. A file importing a
candidate that may define a loss-scaler wrapper class (a GradScaler and a ``__call__``), or
that uses a scaler it may be handed (``grad_scaler.scale(loss)`` in a helper), is looked at as
well: it builds or calls the wrapper, or hands the helpers the scaler. Imports are found with a
regular expression, not a parser, and resolved against the files given.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterator, List, Sequence, Set, Tuple

__all__ = [
    "SCALER_USE",
    "calls_a_scaler",
    "imported_modules",
    "might_use_a_scaler",
    "might_use_amp",
    "select_candidates",
]

#: Any one of these substrings marks a file. They are looked for with ``in``, not with one
#: regular expression of alternatives (which tries each of them at every character: a third
#: of ``--check``'s time on a large tree of plain files).
_LITERAL_MARKERS = ("GradScaler", "scale_loss", ".scale(", "unscale_", "amp.initialize", "FP16_Optimizer", "amp_handle")
#: Whole words that mark a file: (the word, its pattern), searched only where the word occurs.
_WORD_MARKERS = tuple((word, re.compile(rf"\b{word}\b")) for word in ("apex", "NativeScaler"))
_AMP_IMPORT = re.compile(r"^[ \t]*(?:from|import)[ \t][^\n]*\bamp\b", re.M)
#: Uses of a scaler object whose construction may be elsewhere (``self.scaler.scale(loss)``,
#: ``loss_scaler.unscale_(opt)``).
SCALER_USE = re.compile(r"\.scale\(|\.unscale_\(|\bloss_scaler\b")
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.M)
_FROM = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.M)
_NAME = re.compile(r"[A-Za-z_][\w.]*")
_CALLABLE_CLASS = re.compile(r"^[ \t]+def[ \t]+__call__[ \t]*\(", re.M)


def might_use_amp(text: str) -> bool:
    """True if ``text`` mentions a GradScaler, a scaler call or an AMP/apex import."""
    return (
        any(marker in text for marker in _LITERAL_MARKERS)
        or any(word in text and pattern.search(text) is not None for word, pattern in _WORD_MARKERS)
        or ("amp" in text and _AMP_IMPORT.search(text) is not None)
    )


def calls_a_scaler(text: str) -> bool:
    """True if :data:`SCALER_USE` occurs in ``text`` (tested without the regex where a
    substring decides)."""
    return ".scale(" in text or ".unscale_(" in text or ("loss_scaler" in text and SCALER_USE.search(text) is not None)


def might_use_a_scaler(text: str) -> bool:
    """True if ``text`` has an AMP marker (:func:`might_use_amp`) or a :data:`SCALER_USE`."""
    return might_use_amp(text) or calls_a_scaler(text)


def imported_modules(text: str) -> Iterator[Tuple[int, str]]:
    """``(level, dotted name)`` of every module ``text`` may import: level 0 for an
    absolute import, the number of leading dots for a relative one. ``from m import a``
    yields ``m`` and ``m.a`` (``a`` may be a submodule)."""
    for match in _IMPORT.finditer(text):
        for part in match.group(1).split(","):
            name = _NAME.match(part.strip())
            if name:
                yield 0, name.group()
    for match in _FROM.finditer(text):
        level, base = len(match.group(1)), match.group(2)
        if base or not level:
            yield level, base
        for part in match.group(3).strip("()").split(","):
            name = _NAME.match(part.strip())
            if name:
                yield level, f"{base}.{name.group()}" if base else name.group()


def select_candidates(paths: Sequence[str], texts: Sequence[str]) -> List[bool]:
    """For each file (``paths[i]`` holds ``texts[i]``): True if the engine must look at
    it, because it has a marker or a selected file imports it (followed transitively).

    An absolute import ``a.b`` matches every given file whose path ends in ``a/b.py`` or
    ``a/b/__init__.py``; a relative one is resolved from the importing file's folder.
    """
    by_suffix: Dict[str, Set[int]] = {}
    by_path: Dict[str, int] = {}
    for index, path in enumerate(paths):
        full = os.path.normpath(os.path.abspath(path))
        by_path[full] = index
        parts = _module_parts(full)
        for start in range(len(parts)):
            by_suffix.setdefault(".".join(parts[start:]), set()).add(index)
    selected = [might_use_amp(text) for text in texts]
    handed_to = {  # candidates whose importers may build or hand them what they use
        i
        for i, text in enumerate(texts)
        if selected[i] and ("GradScaler" in text and _CALLABLE_CLASS.search(text) or calls_a_scaler(text))
    }
    for index, chosen in enumerate(selected):
        if handed_to and not chosen and handed_to & set(_resolve(paths[index], texts[index], by_suffix, by_path)):
            selected[index] = True
    pending = [index for index, chosen in enumerate(selected) if chosen]
    while pending:
        index = pending.pop()
        for imported in _resolve(paths[index], texts[index], by_suffix, by_path):
            if not selected[imported]:
                selected[imported] = True
                pending.append(imported)
    return selected


def _module_parts(full_path: str) -> List[str]:
    """The dotted-name parts of the module at ``full_path`` (``pkg/__init__.py`` is ``pkg``)."""
    folder, name = os.path.split(full_path)
    stem = os.path.splitext(name)[0]
    parts = [part for part in folder.split(os.sep) if part]
    return parts if stem == "__init__" else [*parts, stem]


def _resolve(path: str, text: str, by_suffix: Dict[str, Set[int]], by_path: Dict[str, int]) -> Iterator[int]:
    """The given files that ``text`` (the file at ``path``) imports."""
    for level, name in imported_modules(text):
        if level == 0:
            yield from by_suffix.get(name, ())
            continue
        folder = os.path.dirname(os.path.normpath(os.path.abspath(path)))
        for _ in range(level - 1):
            folder = os.path.dirname(folder)
        base = os.path.join(folder, *name.split(".")) if name else folder
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if candidate in by_path:
                yield by_path[candidate]
