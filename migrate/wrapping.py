"""Wrap the migrated lines that came out longer than :data:`LINE_LENGTH`.

A rewrite makes lines longer: a generated ``model.forward_backward(input_args=..., label=...,
loss_fn=..., return_outputs=True)[1]``, a user's ``model.state_dict()`` that became
``model.model.state_dict()``. :func:`wrap_long_lines` splits such a line the way black and
ruff format do when a call or a display carries a trailing comma: one element per line, one
indentation step in, the closing bracket back on its own line. A formatter leaves that form
as it is, so a file that was formatted stays formatted.

Only lines the migration wrote are wrapped: a line whose text is a line of the original file
is the user's and stays as it was, however long. On a wrapped line the outermost call, dict,
list or set that starts and ends on it is split; a part still too long is split the same way
in the next round.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Set, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import CodeRange

from .source_layout import module_layout

__all__ = ["LINE_LENGTH", "wrap_long_lines"]

#: The line length generated code keeps to (ruff's ``E501`` at this project's setting). The
#: codemod cannot know a user's formatter configuration; a longer limit there wraps less.
LINE_LENGTH = 120
_ROUNDS = 8  # each round splits one bracket level of every long line

Splittable = Union[cst.Call, cst.Dict, cst.List, cst.Set]


def wrap_long_lines(module: cst.Module, original: str) -> str:
    """The code of ``module`` (the migration of the text ``original``) with its new long
    lines wrapped."""
    user_lines = set(original.splitlines())
    text = module.code
    for _ in range(_ROUNDS):
        lines = text.splitlines()
        long_lines = {
            number for number, line in enumerate(lines, 1) if len(line) > LINE_LENGTH and line not in user_lines
        }
        if not long_lines:
            return text
        # The positions from one code generation: no batched traversal (migrate.source_layout).
        finder = _OutermostSplittable(long_lines, module_layout(module).positions)
        module.visit(finder)
        if not finder.found:
            return text
        indents = {id(node): _indent_of(lines[line - 1]) for line, node in finder.found.items()}
        module = module.visit(_Split(indents, finder.paths, module.default_indent))
        text = module.code
    return text


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


class _OutermostSplittable(cst.CSTVisitor):
    """For each of ``lines``, the outermost splittable node to split for it: one lying on
    that line alone, or one spanning it that is not yet split one element per line (a call
    whose arguments hug their own line, ``f(\\n    a, g(b)\\n)``: ruff format splits every
    bracket around a split one, so the outer one goes first). A node holding a comment is
    never chosen (splitting rewrites its whitespace), and nodes under a chosen one wait for
    the next round, when their own line's indentation is known."""

    def __init__(self, lines: Set[int], positions: Mapping[cst.CSTNode, CodeRange]) -> None:
        super().__init__()
        self._lines = lines
        self._positions = positions
        self._in_fstring = 0
        self._chosen_until = 0  # the last line of the chosen node being visited, if any
        self._open: List[cst.CSTNode] = []  # the node being visited and those above it
        self.found: Dict[int, Splittable] = {}
        self.paths: Set[int] = set()  # ids of the chosen nodes and of the nodes above them

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        self._in_fstring += 1  # a line break inside an f-string is not valid before 3.12

    def leave_FormattedString(self, original_node: cst.FormattedString) -> None:
        self._in_fstring -= 1

    def on_visit(self, node: cst.CSTNode) -> bool:
        self._open.append(node)  # popped in on_leave, which libcst calls whatever this returns
        if isinstance(node, cst.SimpleStatementLine) and not self._spans_a_line(node):
            return False  # nothing to split in it: not entered (a libcst traversal rebuilds nodes)
        if not super().on_visit(node):
            return False
        if self._in_fstring or not isinstance(node, (cst.Call, cst.Dict, cst.List, cst.Set)):
            return True
        where = self._positions[node]
        if where.start.line <= self._chosen_until:
            return True
        spanned = [line for line in range(where.start.line, where.end.line + 1) if line in self._lines]
        if not spanned or not _elements(node) or (isinstance(node, cst.Call) and _bare_generator(node)):
            return True
        single = where.start.line == where.end.line
        if not single and (_split_already(node) or m.findall(node, m.Comment())):
            return True
        self.found[where.start.line] = node
        self.paths.update(id(open_node) for open_node in self._open)
        self._chosen_until = where.end.line
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._open.pop()
        super().on_leave(original_node)

    def _spans_a_line(self, line: cst.SimpleStatementLine) -> bool:
        """One of the long lines is in ``line``'s range, which holds every node under it
        (unlike a compound statement's range, which ends with its body, before an
        ``else``, and starts after its decorators)."""
        where = self._positions[line]
        return any(where.start.line <= number <= where.end.line for number in self._lines)


def _split_already(node: Splittable) -> bool:
    """Every element of ``node`` starts a line of its own."""
    if isinstance(node, cst.Call):
        opening = node.whitespace_before_args
    elif isinstance(node, cst.List):
        opening = node.lbracket.whitespace_after
    else:
        opening = node.lbrace.whitespace_after
    elements = _elements(node)
    breaks: List[Optional[cst.BaseParenthesizableWhitespace]] = [opening] + [
        getattr(e.comma, "whitespace_after", None) for e in elements[:-1]
    ]
    return all(isinstance(b, cst.ParenthesizedWhitespace) for b in breaks)


def _elements(node: Splittable) -> List[Union[cst.Arg, cst.BaseElement, cst.BaseDictElement]]:
    return list(node.args if isinstance(node, cst.Call) else node.elements)


def _bare_generator(call: cst.Call) -> bool:
    """``f(x for x in y)``: a trailing comma would not be valid there."""
    return any(isinstance(arg.value, cst.GeneratorExp) and not arg.value.lpar for arg in call.args)


class _Split(cst.CSTTransformer):
    """Splits the nodes keyed (by id) in ``indents``, whose lines start with that
    indentation. Only the nodes in ``paths`` (ids: the split nodes and those above them)
    are entered; the rest of the tree is kept as it is, not rebuilt."""

    def __init__(self, indents: Dict[int, str], paths: Set[int], step: str) -> None:
        super().__init__()
        self._indents = indents
        self._paths = paths
        self._step = step

    def on_visit(self, node: cst.CSTNode) -> bool:
        return id(node) in self._paths

    def on_leave(self, original_node, updated_node):
        indent: Optional[str] = self._indents.get(id(original_node))
        if indent is None:
            return updated_node
        inner, outer = _break(indent + self._step), _break(indent)
        elements = _elements(updated_node)
        split = [
            element.with_changes(comma=cst.Comma(whitespace_after=inner if i < len(elements) - 1 else outer))
            for i, element in enumerate(elements)
        ]
        if isinstance(updated_node, cst.Call):
            split = [arg.with_changes(whitespace_after_arg=cst.SimpleWhitespace("")) for arg in split]
            return updated_node.with_changes(args=split, whitespace_before_args=inner)
        if isinstance(updated_node, cst.List):
            return updated_node.with_changes(
                elements=split,
                lbracket=cst.LeftSquareBracket(whitespace_after=inner),
                rbracket=cst.RightSquareBracket(),
            )
        return updated_node.with_changes(
            elements=split, lbrace=cst.LeftCurlyBrace(whitespace_after=inner), rbrace=cst.RightCurlyBrace()
        )


def _break(indent: str) -> cst.ParenthesizedWhitespace:
    """A line break inside brackets, the next line starting with ``indent``."""
    return cst.ParenthesizedWhitespace(last_line=cst.SimpleWhitespace(indent), indent=False)
