"""Collected edits and the one transformer pass that applies them.

Rules never mutate the tree; they record what to change, keyed by nodes of the analysed
tree, and :class:`EditApplier` applies everything in a single bottom-up pass:

* expression edits: ``node -> function(updated_node) -> new_node``;
* block edits: in a statement list (module body or an indented block), replace the range
  ``[start, end)`` with ``function(updated_statements_in_range)``; ranges must not overlap;
* insertions before a statement are block edits of an empty range.

Comments survive because statements are moved as whole nodes (with their leading lines),
and a statement that is dropped hands its comments to the first statement replacing it.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Sequence, Set, Tuple, TypeVar, cast

import libcst as cst
import libcst.matchers as m

from .layout import tidy_blank_lines
from .syntax import leading_lines

__all__ = ["Edits", "EditApplier", "EditConflict", "PendingComments", "carry_comments", "drop_keeping_comments"]


class EditConflict(ValueError):
    """Two rules want to change the same statements: the plan is not consistent."""


StatementBuilder = Callable[[List[cst.BaseStatement]], List[cst.BaseStatement]]
Node = TypeVar("Node", bound=cst.CSTNode)


class Edits:
    """What to change; filled by the rules, applied by :class:`EditApplier`."""

    def __init__(self) -> None:
        self.expressions: Dict[cst.CSTNode, Callable[[cst.CSTNode], cst.CSTNode]] = {}
        self.blocks: Dict[cst.CSTNode, List[Tuple[int, int, StatementBuilder]]] = {}
        self._insertions: Dict[Tuple[int, int], List[cst.BaseStatement]] = {}

    def replace_expression(self, node: Node, build: Callable[[Node], cst.CSTNode]) -> None:
        # The applier calls ``build`` with the updated copy of ``node``: a node of its class.
        self.expressions[node] = cast(Callable[[cst.CSTNode], cst.CSTNode], build)

    def replace_range(self, block: cst.CSTNode, start: int, end: int, build: StatementBuilder) -> None:
        ranges = self.blocks.setdefault(block, [])
        for other_start, other_end, _ in ranges:
            if start < other_end and other_start < end:
                raise EditConflict("overlapping statement edits")
        ranges.append((start, end, build))

    def insert_before(self, block: cst.CSTNode, index: int, statements: Sequence[cst.BaseStatement]) -> None:
        """Insert before statement ``index``; several insertions there keep their order."""
        pending = self._insertions.setdefault((id(block), index), [])
        if not pending:
            self.replace_range(block, index, index, lambda _: list(pending))
        pending.extend(statements)

    def __bool__(self) -> bool:
        return bool(self.expressions or self.blocks)


def carry_comments(dropped: Sequence[cst.BaseStatement], target: cst.BaseStatement) -> cst.BaseStatement:
    """Give ``target`` the leading comment lines (and same-line comments) of ``dropped``."""
    lines = _comment_lines(dropped)
    if not lines:
        return target
    return target.with_changes(leading_lines=[*lines, *leading_lines(target)])


class PendingComments:
    """Comment lines of dropped statements, to be put on the next statement of the block."""

    def __init__(self, lines: Sequence[cst.EmptyLine]) -> None:
        self.lines = list(lines)


def _comment_lines(statements: Sequence[cst.BaseStatement]) -> List[cst.EmptyLine]:
    """The leading lines of ``statements`` plus every comment inside them, as lines."""
    lines: List[cst.EmptyLine] = []
    for statement in statements:
        lines.extend(leading_lines(statement))
        inner = statement.with_changes(leading_lines=())
        comments = m.findall(inner, m.Comment())
        lines.extend(cst.EmptyLine(comment=comment) for comment in comments if isinstance(comment, cst.Comment))
    return lines


def drop_keeping_comments(updated: List[cst.BaseStatement]) -> list:
    """A block-edit builder that removes statements but keeps their comments."""
    lines = _comment_lines(updated)
    return [PendingComments(lines)] if any(line.comment is not None for line in lines) else []


def _settle_comments(body: list, footer: Sequence[cst.EmptyLine]) -> Tuple[list, list]:
    """Attach :class:`PendingComments` to the statement after them (or the block footer)."""
    settled: list = []
    waiting: List[cst.EmptyLine] = []
    for item in body:
        if isinstance(item, PendingComments):
            waiting.extend(item.lines)
            continue
        if waiting:
            item = item.with_changes(leading_lines=[*waiting, *item.leading_lines])
            waiting = []
        settled.append(item)
    return settled, [*waiting, *footer]


class EditApplier(cst.CSTTransformer):
    """Applies :class:`Edits` to the tree they were recorded on.

    ``ancestors(node)`` gives the nodes above a node of that tree: the pass only goes down
    the paths to edited nodes, and every other subtree is kept as it is without being
    rebuilt (a libcst traversal rebuilds each node it enters).
    """

    def __init__(self, edits: Edits, ancestors: Callable[[cst.CSTNode], Iterable[cst.CSTNode]]) -> None:
        super().__init__()
        self._edits = edits
        self._ancestors = ancestors
        self._paths: Set[cst.CSTNode] = set()
        for node in [*edits.expressions, *edits.blocks]:
            self._paths.add(node)
            self._paths.update(ancestors(node))

    def on_visit(self, node: cst.CSTNode) -> bool:
        return node in self._paths

    def on_leave(self, original_node, updated_node):
        build = self._edits.expressions.get(original_node)
        if build is not None:
            updated_node = build(updated_node)
        ranges = self._edits.blocks.get(original_node)
        if ranges:
            body = list(updated_node.body)
            before = {id(statement) for statement in body}
            first = body[0] if body else None
            for start, end, build_statements in sorted(ranges, key=lambda r: (r[0], r[1]), reverse=True):
                body[start:end] = build_statements(body[start:end])
            statements = [item for item in body if not isinstance(item, PendingComments)]
            generated = [id(statement) not in before for statement in statements]
            first_replaced = bool(statements) and statements[0] is not first
            body, footer = _settle_comments(body, updated_node.footer)
            owner = (
                original_node if isinstance(original_node, cst.Module) else next(iter(self._ancestors(original_node)))
            )
            body = tidy_blank_lines(body, generated, first_replaced, owner)
            updated_node = updated_node.with_changes(body=body, footer=footer)
        return updated_node
