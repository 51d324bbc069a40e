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

from typing import Dict, List, Optional, Set, Tuple, Union

import libcst as cst
from libcst.metadata import CodeRange

from .source_layout import Layout, module_layout

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
        # The positions and the source order from one code generation (migrate.source_layout).
        found, paths = _outermost_splittable(long_lines, module_layout(module))
        if not found:
            return text
        indents = {id(node): _indent_of(lines[line - 1]) for line, node in found.items()}
        module = module.visit(_Split(indents, paths, module.default_indent))
        text = module.code
    return text


def _indent_of(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _outermost_splittable(lines: Set[int], layout: Layout) -> Tuple[Dict[int, Splittable], Set[int]]:
    """For each of ``lines``, the outermost splittable node to split for it: one lying on
    that line alone, or one spanning it that is not yet split one element per line (a call
    whose arguments hug their own line, ``f(\\n    a, g(b)\\n)``: ruff format splits every
    bracket around a split one, so the outer one goes first); and the ids of the chosen
    nodes and of the nodes above them. A node holding a comment is never chosen (splitting
    rewrites its whitespace), nor one inside an f-string (a line break there is not valid
    before 3.12), and nodes under a chosen one wait for the next round, when their own
    line's indentation is known. The nodes are read off the source order of ``layout`` (no
    libcst traversal, which would rebuild them); a simple statement line none of ``lines``
    falls in is skipped whole."""
    order, positions, nodes = layout.order, layout.positions, layout.nodes
    found: Dict[int, Splittable] = {}
    paths: Set[int] = set()
    chosen_until = 0  # the last line of the last chosen node
    fstring_end = 0  # the rank past the f-string being read, if any
    above: List[Tuple[cst.CSTNode, int]] = []  # the nodes above the one read, with their ends
    rank = 0
    while rank < len(nodes):
        node = nodes[rank]
        start, end, _ = order[node]
        end += rank - start  # this place's end: a node at several places is recorded at its last
        while above and above[-1][1] <= rank:
            above.pop()
        if isinstance(node, cst.SimpleStatementLine) and not _spans_a_line(positions[node], lines):
            rank = end
            continue
        above.append((node, end))
        rank += 1
        if rank <= fstring_end:
            continue
        if isinstance(node, cst.FormattedString):
            fstring_end = end
            continue
        if not isinstance(node, (cst.Call, cst.Dict, cst.List, cst.Set)):
            continue
        where = positions[node]
        if where.start.line <= chosen_until:
            continue
        spanned = [line for line in range(where.start.line, where.end.line + 1) if line in lines]
        if not spanned or not _elements(node) or (isinstance(node, cst.Call) and _bare_generator(node)):
            continue
        single = where.start.line == where.end.line
        if not single and (_split_already(node) or any(isinstance(inner, cst.Comment) for inner in nodes[rank:end])):
            continue
        found[where.start.line] = node
        paths.update(id(open_node) for open_node, _ in above)
        chosen_until = where.end.line
    return found, paths


def _spans_a_line(where: CodeRange, lines: Set[int]) -> bool:
    """One of ``lines`` is in the range ``where`` of a simple statement line, which holds
    every node under it (unlike a compound statement's range, which ends with its body,
    before an ``else``, and starts after its decorators)."""
    return any(where.start.line <= number <= where.end.line for number in lines)


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
