"""Positions and source order of a module's nodes, from one plain code generation.

libcst's ``PositionProvider`` generates the module's code once, keeping the line and column
as it goes (a regular-expression split of every token) and recording each node's range;
resolved through ``MetadataWrapper`` it also makes a batched traversal of the whole tree,
which rebuilds every node (about as much work as parsing the file). :func:`module_layout`
generates the code once and records, per node, only character offsets into the text: where
its code starts and ends, by the same rules as ``PositionProvider`` (a node's syntactic
range where it reports one, else the range of all its code). A node's line and column are
worked out from the offsets when asked. The same generation calls every node in source
order, entering a node before the nodes under it and leaving it after them, so it also
records each node's rank in source order, the rank just past its subtree and its parent.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst.metadata import CodePosition, CodeRange
from libcst.metadata.position_provider import NEWLINE_RE

__all__ = ["Layout", "SourceOrder", "module_layout"]

#: A node's (rank in source order, rank just past its subtree, parent; None for the root).
SourceOrder = Tuple[int, int, Optional[cst.CSTNode]]


@dataclass(frozen=True)
class Layout:
    """What one code generation of a module records."""

    code: str  # the module's text (``module.code``)
    positions: Mapping[cst.CSTNode, CodeRange]  # what ``PositionProvider`` gives
    order: Mapping[cst.CSTNode, SourceOrder]
    # The nodes by rank, in source order. A node standing at several places (a tree made by
    # edits may reuse one) is there once per place; ``order`` and ``positions`` give its last.
    nodes: Sequence[cst.CSTNode]


class _Positions(Mapping[cst.CSTNode, CodeRange]):
    """Each node's ``CodeRange``, worked out from its character offsets when asked."""

    def __init__(self, offsets: Mapping[cst.CSTNode, Tuple[int, int]], text: str) -> None:
        self._offsets = offsets
        # Offsets where a line starts; the first line starts at 0.
        self._line_starts = [0] + [match.end() for match in NEWLINE_RE.finditer(text)]

    def _position(self, offset: int) -> CodePosition:
        line = bisect_right(self._line_starts, offset)
        return CodePosition(line, offset - self._line_starts[line - 1])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        start, end = self._offsets[node]
        return CodeRange(self._position(start), self._position(end))

    def __iter__(self) -> Iterator[cst.CSTNode]:
        return iter(self._offsets)

    def __len__(self) -> int:
        return len(self._offsets)


class _SyntacticRange:
    """What ``record_syntactic_position`` returns: records ``node``'s range on exit."""

    __slots__ = ("_state", "_node", "_start_node", "_end_node", "_start")

    def __init__(
        self,
        state: _RecordingState,
        node: cst.CSTNode,
        start_node: Optional[cst.CSTNode],
        end_node: Optional[cst.CSTNode],
    ) -> None:
        self._state, self._node, self._start_node, self._end_node = state, node, start_node, end_node

    def __enter__(self) -> None:
        self._start = self._state.offset

    def __exit__(self, *exc: object) -> None:
        offsets = self._state.offsets
        start = offsets[self._start_node][0] if self._start_node is not None else self._start
        end = offsets[self._end_node][1] if self._end_node is not None else self._state.offset
        offsets[self._node] = (start, end)


@dataclass
class _RecordingState(CodegenState):
    """A code generation state that records each node's offsets and source order."""

    offset: int = 0  # characters generated so far (a popped trailing newline included)
    offsets: Dict[cst.CSTNode, Tuple[int, int]] = field(default_factory=dict)
    order: Dict[cst.CSTNode, SourceOrder] = field(default_factory=dict)
    popped: str = ""  # the trailing newline the module took back, if any
    ranked: List[cst.CSTNode] = field(default_factory=list)  # each node, once per place
    _open: List[Tuple[cst.CSTNode, int, int]] = field(default_factory=list)  # node, rank, offset

    def add_indent_tokens(self) -> None:
        super().add_indent_tokens()
        for token in self.indent_tokens:
            self.offset += len(token)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def pop_trailing_newline(self) -> None:
        # Like PositionProvider, the module's end stays past the taken-back newline.
        if self.tokens:
            self.popped = self.tokens[-1]
        super().pop_trailing_newline()

    def before_codegen(self, node: cst.CSTNode) -> None:
        self._open.append((node, len(self.ranked), self.offset))
        self.ranked.append(node)

    def after_codegen(self, node: cst.CSTNode) -> None:
        _, rank, start = self._open.pop()
        self.order[node] = (rank, len(self.ranked), self._open[-1][0] if self._open else None)
        if node not in self.offsets:  # a syntactic range recorded inside wins
            self.offsets[node] = (start, self.offset)

    def record_syntactic_position(  # type: ignore[override]
        self,
        node: cst.CSTNode,
        *,
        start_node: Optional[cst.CSTNode] = None,
        end_node: Optional[cst.CSTNode] = None,
    ) -> _SyntacticRange:
        return _SyntacticRange(self, node, start_node, end_node)


def module_layout(module: cst.Module) -> Layout:
    """The text of ``module``, the position of each of its nodes and their source order."""
    state = _RecordingState(default_indent=module.default_indent, default_newline=module.default_newline)
    module._codegen(state)
    code = "".join(state.tokens)
    return Layout(
        code=code, positions=_Positions(state.offsets, code + state.popped), order=state.order, nodes=state.ranked
    )
