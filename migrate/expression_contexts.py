"""The expression context of a node, worked out from the nodes above it when asked.

libcst's ``ExpressionContextVisitor`` walks the whole module to record, for every ``Name``,
``Attribute``, ``Subscript``, ``Tuple``, ``List`` and ``StarredElement`` it reaches, whether
it is loaded, stored or deleted (a libcst traversal rebuilds every node: about as much work
as parsing the file). Its rules only look downwards: a node is reached in the context its
parent hands to that field (the targets of an assignment are stored, the value of an
attribute is loaded, the attribute's name is not reached at all...), and every other field
gets the parent's own context. :class:`ExpressionContexts` applies the same rules from a
node up through its parents, so only the nodes asked about (the names that libcst's
``ScopeVisitor`` records) and the nodes above them are looked at.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import libcst as cst
from libcst.metadata import ExpressionContext

__all__ = ["ExpressionContexts"]

Context = Optional[ExpressionContext]  # None: the node is not reached, so it has none
STORE, LOAD, DEL = ExpressionContext.STORE, ExpressionContext.LOAD, ExpressionContext.DEL


def _one_of(child: cst.CSTNode, nodes: Sequence[cst.CSTNode]) -> bool:
    return any(node is child for node in nodes)


def _assign(parent: cst.Assign, child: cst.CSTNode, own: Context) -> Context:
    return STORE if _one_of(child, parent.targets) else own if child is parent.value else None


def _ann_assign(parent: cst.AnnAssign, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.target:
        return STORE
    return own if child is parent.annotation or child is parent.value else None


def _target_value(parent: cst.AugAssign | cst.NamedExpr, child: cst.CSTNode, own: Context) -> Context:
    return STORE if child is parent.target else own if child is parent.value else None


def _as_name(parent: cst.AsName, child: cst.CSTNode, own: Context) -> Context:
    return STORE if child is parent.name else None


def _comp_for(parent: cst.CompFor, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.target:
        return STORE
    reached = child is parent.iter or child is parent.inner_for_in or _one_of(child, parent.ifs)
    return own if reached else None


def _for(parent: cst.For, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.target:
        return STORE
    return own if child is parent.iter or child is parent.body or child is parent.orelse else None


def _del(parent: cst.Del, child: cst.CSTNode, own: Context) -> Context:
    return DEL if child is parent.target else None


def _attribute(parent: cst.Attribute, child: cst.CSTNode, own: Context) -> Context:
    return LOAD if child is parent.value else None  # the attribute's own name is not reached


def _subscript(parent: cst.Subscript, child: cst.CSTNode, own: Context) -> Context:
    return LOAD if child is parent.value or _one_of(child, parent.slice) else None


def _class_def(parent: cst.ClassDef, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.name:
        return STORE
    reached = (
        child is parent.body
        or _one_of(child, parent.bases)
        or _one_of(child, parent.keywords)
        or _one_of(child, parent.decorators)
    )
    return own if reached else None


def _function_def(parent: cst.FunctionDef, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.name:
        return STORE
    reached = (
        child is parent.params or child is parent.body or child is parent.returns or _one_of(child, parent.decorators)
    )
    return own if reached else None


def _param(parent: cst.Param, child: cst.CSTNode, own: Context) -> Context:
    if child is parent.name:
        return STORE
    return own if child is parent.annotation or child is parent.default else None


def _name(parent: cst.Name, child: cst.CSTNode, own: Context) -> Context:
    return None  # a name's parentheses are not entered


#: For a parent of these types, the context each child is reached in, given the parent's
#: own context; the children of any other node are reached in its own context.
_RULES: Dict[type, Callable[[cst.CSTNode, cst.CSTNode, Context], Context]] = {
    cst.Assign: _assign,  # type: ignore[dict-item]
    cst.AnnAssign: _ann_assign,  # type: ignore[dict-item]
    cst.AugAssign: _target_value,  # type: ignore[dict-item]
    cst.NamedExpr: _target_value,  # type: ignore[dict-item]
    cst.AsName: _as_name,  # type: ignore[dict-item]
    cst.CompFor: _comp_for,  # type: ignore[dict-item]
    cst.For: _for,  # type: ignore[dict-item]
    cst.Del: _del,  # type: ignore[dict-item]
    cst.Attribute: _attribute,  # type: ignore[dict-item]
    cst.Subscript: _subscript,  # type: ignore[dict-item]
    cst.ClassDef: _class_def,  # type: ignore[dict-item]
    cst.FunctionDef: _function_def,  # type: ignore[dict-item]
    cst.Param: _param,  # type: ignore[dict-item]
    cst.Name: _name,  # type: ignore[dict-item]
}

#: The node types ``ExpressionContextVisitor`` records a context for.
_RECORDED = (cst.Name, cst.Attribute, cst.Subscript, cst.Tuple, cst.List, cst.StarredElement)


class ExpressionContexts(Mapping[cst.CSTNode, ExpressionContext]):
    """What ``ExpressionContextVisitor`` records for a module, as a mapping that works a
    node's context out when it is looked up.

    ``parents`` gives each node of the module its parent (the module's own: None). A node
    of a type the visitor does not record, or one it does not reach, is not a key.
    Iterating is not supported: the keys are only known by asking.
    """

    def __init__(self, parents: Mapping[cst.CSTNode, Tuple[int, int, Optional[cst.CSTNode]]]) -> None:
        self._parents = parents
        self._reached: Dict[cst.CSTNode, Context] = {}  # each node looked at: its visitor's context

    def _context(self, node: cst.CSTNode) -> Context:
        """The context of the visitor that reaches ``node`` (None: not reached)."""
        pending: List[cst.CSTNode] = []
        current: Optional[cst.CSTNode] = node
        while current is not None and current not in self._reached:
            pending.append(current)
            current = self._parents[current][2]
        context: Context = LOAD if current is None else self._reached[current]
        for child in reversed(pending):
            parent = self._parents[child][2]
            if parent is not None:
                rule = _RULES.get(type(parent))
                if context is not None and rule is not None:
                    context = rule(parent, child, context)
            self._reached[child] = context
        return context

    def __getitem__(self, node: cst.CSTNode) -> ExpressionContext:
        context = self._context(node) if isinstance(node, _RECORDED) and node in self._parents else None
        if context is None:
            raise KeyError(node)
        return context

    def __iter__(self) -> Iterator[cst.CSTNode]:
        raise TypeError("the expression contexts are only known by asking for a node")

    def __len__(self) -> int:
        raise TypeError("the expression contexts are only known by asking for a node")
