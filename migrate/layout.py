"""Blank lines around what a block edit generated, as a formatter (black, ruff format) puts them.

:class:`~migrate.edits.EditApplier` calls :func:`tidy_blank_lines` on every statement list it
edited. Only the places the edit made are touched, so user code keeps its own layout:

* a generated function (``def _loss_fn``, ``def _step_fn``) gets one blank line before it
  (two at module level); when it opens a block, none if the block is a function's body or
  the function's comments come first, else one;
* the statement after a generated function gets the same;
* a generated statement right after an import line gets one blank line before it;
* when the block's first statement was removed, the new first statement loses the blank
  lines that separated it from the removed one (a block does not open with a blank line).

Blank lines are counted before a statement's first leading comment, so comments stay where
they were, attached to their statement.
"""

from __future__ import annotations

from typing import List, Sequence

import libcst as cst

from .syntax import is_import_line, leading_lines

__all__ = ["tidy_blank_lines"]


def tidy_blank_lines(
    body: Sequence[cst.BaseStatement], generated: Sequence[bool], first_replaced: bool, owner: cst.CSTNode
) -> List[cst.BaseStatement]:
    """``body`` (the edited statements of ``owner``'s block, ``generated[i]`` true for those the
    edit created) with the blank lines described above; ``first_replaced``: the block's
    first statement is no longer the one it had."""
    spacing = 2 if isinstance(owner, cst.Module) else 1
    tidy = list(body)
    for index, statement in enumerate(tidy):
        if generated[index] and isinstance(statement, cst.FunctionDef):
            commented = any(line.comment is not None for line in leading_lines(statement))
            opens_body = index == 0 and (commented or isinstance(owner, (cst.FunctionDef, cst.Module)))
            tidy[index] = _with_blank_lines(statement, 0 if opens_body else spacing)
        elif index > 0 and generated[index - 1] and isinstance(tidy[index - 1], cst.FunctionDef):
            tidy[index] = _with_blank_lines(statement, spacing)
        elif generated[index] and index > 0 and _follows_imports(statement, tidy[index - 1]):
            tidy[index] = _with_blank_lines(statement, 1)
        elif index == 0 and first_replaced and not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            tidy[index] = _with_blank_lines(statement, 0)
    return tidy


def _with_blank_lines(statement: cst.BaseStatement, count: int) -> cst.BaseStatement:
    """``statement`` with exactly ``count`` blank lines before its first leading comment."""
    lines = list(leading_lines(statement))
    first_comment = next((i for i, line in enumerate(lines) if line.comment is not None), len(lines))
    if first_comment == count and all(line.comment is None for line in lines[:count]):
        return statement
    blank = [cst.EmptyLine(indent=False)] * count
    return statement.with_changes(leading_lines=[*blank, *lines[first_comment:]])


def _follows_imports(statement: cst.BaseStatement, previous: cst.BaseStatement) -> bool:
    """``statement`` comes right after an import line, with no blank line between."""
    return (
        is_import_line(previous)
        and not is_import_line(statement)
        and (not leading_lines(statement) or leading_lines(statement)[0].comment is not None)
    )
