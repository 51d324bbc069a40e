"""The lines a migrated module gains at its top: ``import roundpipe`` and the microbatch constant.

:func:`add_header` runs on the migrated module, after every rule's edit, so it sees the
import block as it ends up (a ``GradScaler`` import a rule dropped is gone). The module's top
import block is its docstring, ``__future__`` and the import lines before any other statement;
both lines go there, so module code that runs before a later import already sees them.

They are placed the way an import sorter (isort, ruff's ``I`` rules) would place them, so a
file that was sorted stays sorted: ``import roundpipe`` joins, in name order among the plain
``import`` lines, the section (a run of import lines without a blank line between) that
imports torch or apex; without one it becomes a section of its own after the block. The
constant follows the block after one blank line. ``import roundpipe`` is not repeated when the
block has it.
"""

from __future__ import annotations

from typing import AbstractSet, List, Optional, Sequence, Tuple

import libcst as cst
import libcst.matchers as m

from . import templates
from .syntax import is_import_line, leading_lines

__all__ = ["add_header", "top_block"]

_MICROBATCH_NOTE = "  # roundpipe-migrate: microbatches per batch; mean losses are divided by it"
_THIRD_PARTY_ANCHORS = frozenset({"torch", "apex"})
_ROUNDPIPE = "roundpipe"
_IMPORT_ROUNDPIPE = m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name(_ROUNDPIPE), asname=None)])])


def add_header(module: cst.Module, microbatch: str, read: AbstractSet[str]) -> cst.Module:
    """``module`` with ``import roundpipe`` (unless its top block has it) and
    ``<microbatch> = 1`` added to its top import block, each only when the migrated code
    reads that name (a file whose only change is at a call site needs neither). ``read``:
    the values of every ``Name`` node of ``module``."""
    body: List[cst.BaseStatement] = list(module.body)
    start, end = top_block(body)
    if _ROUNDPIPE in read and not any(m.matches(statement, _IMPORT_ROUNDPIPE) for statement in body[start:end]):
        end = _insert_import(body, start, end)
    if microbatch in read:
        constant = templates.statement(f"{microbatch} = 1{_MICROBATCH_NOTE}\n")
        body.insert(end, constant.with_changes(leading_lines=[cst.EmptyLine()]))
    return module.with_changes(body=body)


def top_block(body: Sequence[cst.BaseStatement]) -> Tuple[int, int]:
    """``(first import, end)``: where the top block's imports start (after the docstring)
    and the index just after its last import line."""
    start = 1 if body and _is_docstring(body[0]) else 0
    end = start
    while end < len(body) and is_import_line(body[end]):
        end += 1
    return start, end


def _insert_import(body: List[cst.BaseStatement], start: int, end: int) -> int:
    """Insert ``import roundpipe`` into ``body[start:end]`` (the top block's imports);
    return the block's new end."""
    sections = _sections(body, start, end)
    chosen = next((s for s in sections if any(_top_module(body[i]) in _THIRD_PARTY_ANCHORS for i in s)), None)
    line = templates.statement(f"import {_ROUNDPIPE}\n")
    if chosen is None:  # a section of its own after the block
        spacing = [cst.EmptyLine()] if end > 0 else []
        body.insert(end, line.with_changes(leading_lines=spacing))
        return end + 1
    at = next((i for i in chosen if _sorts_after_roundpipe(body[i])), chosen[-1] + 1)
    if at == chosen[0]:  # the section's blank line moves up to the new first import
        blank, rest = _split_leading_blank(leading_lines(body[at]))
        body[at] = body[at].with_changes(leading_lines=rest)
        line = line.with_changes(leading_lines=blank)
    body.insert(at, line)
    return end + 1


def _sections(body: Sequence[cst.BaseStatement], start: int, end: int) -> List[List[int]]:
    """The indices of ``body[start:end]`` grouped into runs not separated by a blank line."""
    sections: List[List[int]] = []
    for index in range(start, end):
        if not sections or _split_leading_blank(leading_lines(body[index]))[0]:
            sections.append([])
        sections[-1].append(index)
    return sections


def _split_leading_blank(lines: Sequence[cst.EmptyLine]) -> Tuple[List[cst.EmptyLine], List[cst.EmptyLine]]:
    """``lines`` split before its first comment line: (the blank lines before it, the rest)."""
    first_comment = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    return list(lines[:first_comment]), list(lines[first_comment:])


def _sorts_after_roundpipe(statement: cst.BaseStatement) -> bool:
    """A ``from`` import (they follow the plain ones), or a plain import sorting after
    ``roundpipe`` (names compared case-insensitively, as the sorters do by default)."""
    small = _only_import(statement)
    if isinstance(small, cst.ImportFrom):
        return True
    name = _dotted(small.names[0].name) if isinstance(small, cst.Import) else ""
    return name.lower() > _ROUNDPIPE


def _top_module(statement: cst.BaseStatement) -> Optional[str]:
    """The first dotted component of the module a one-import line imports."""
    small = _only_import(statement)
    if isinstance(small, cst.Import):
        return _dotted(small.names[0].name).split(".")[0]
    if isinstance(small, cst.ImportFrom) and small.module is not None and not small.relative:
        return _dotted(small.module).split(".")[0]
    return None


def _only_import(statement: cst.BaseStatement) -> Optional[cst.BaseSmallStatement]:
    if isinstance(statement, cst.SimpleStatementLine) and statement.body:
        return statement.body[0]
    return None


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


def _is_docstring(statement: cst.BaseStatement) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )
