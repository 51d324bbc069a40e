"""libcst's scope analysis of a module, without the full-tree traversals its resolution adds.

``MetadataWrapper.resolve(ScopeProvider)`` makes two batched traversals of the whole tree:
one for ``ExpressionContextProvider`` and one for ``ScopeProvider``, each of which only starts
a visitor of its own from ``visit_Module`` (a libcst traversal rebuilds every node and costs
about as much as parsing the file). :func:`module_scopes` runs ``ScopeVisitor`` on the module
directly and hands it the expression contexts it asks for (whether a name is stored) from
:class:`migrate.expression_contexts.ExpressionContexts`, which works them out from the nodes
above the name instead of walking the module. The scopes are the ones ``ScopeProvider``
computes, node for node, at two traversals fewer and without ``ExpressionContextVisitor``'s.

A libcst traversal (``node.visit(visitor)``) rebuilds every node it enters, even for a
visitor that changes nothing (0.3 to 0.5 of a parse of the module). :class:`_InPlaceScopeVisitor`
enters the children of each node itself, off the recorded source order, and tells libcst not
to, so no node is rebuilt; ``ScopeVisitor``'s own explicit ``visit`` calls (a function's
parameters and body, a call's arguments ...) go the same way. The source order lists a
node's children in the order its code is generated, which differs from libcst's visiting
order only in where a whitespace node stands (``AsName``, ``Del``): the scopes do not
depend on it.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, cast

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider, Scope, ScopeProvider
from libcst.metadata.scope_provider import _ASSIGNMENT_LIKE_NODES, ScopeVisitor

from .expression_contexts import ExpressionContexts
from .source_layout import SourceOrder

__all__ = ["module_scopes"]


class _ScopeRecorder(ScopeProvider):
    """A ``ScopeProvider`` that ``ScopeVisitor`` reports to outside a batched traversal: it
    reads the given expression contexts and keeps the scope recorded for each node."""

    def __init__(self, contexts: Mapping[cst.CSTNode, ExpressionContext]) -> None:
        super().__init__()
        self.metadata = {ExpressionContextProvider: contexts}
        self.scopes: Dict[cst.CSTNode, Optional[Scope]] = {}

    def set_metadata(self, node: cst.CSTNode, value: object) -> None:
        self.scopes[node] = cast(Optional[Scope], value)


#: Per node type: whether ``ScopeVisitor`` does nothing on leaving such a node but record its
#: scope (it is none of the assignment-like nodes whose count orders the accesses, and the
#: visitor keeps ``CSTVisitor``'s empty ``leave_`` method for it). ``ScopeVisitor.on_leave`` checks every node
#: against the assignment-like node classes, each an abstract class whose ``isinstance``
#: check is a call: about half of the visitor's time.
_PLAIN_LEAVES: Dict[type, bool] = {}


class _InPlaceScopeVisitor(ScopeVisitor):
    """``ScopeVisitor`` walking the parsed nodes without rebuilding them: it enters the
    children of a node of the source order itself, in source order, and answers libcst's
    traversal that it need not (a node outside the source order, such as the module parsed
    from a string annotation, is entered by libcst as usual). Leaving a node of a type for
    which ``ScopeVisitor`` only records the scope, it records the scope without the checks
    (:data:`_PLAIN_LEAVES`)."""

    def __init__(
        self, provider: ScopeProvider, nodes: Sequence[cst.CSTNode], order: Mapping[cst.CSTNode, SourceOrder]
    ) -> None:
        super().__init__(provider)
        self._nodes = nodes
        self._order = order

    def on_visit(self, node: cst.CSTNode) -> bool:
        enter = super().on_visit(node)
        extent = self._order.get(node)
        if not enter or extent is None:
            return enter
        index, end, _ = extent
        index += 1
        while index < end:
            child = self._nodes[index]
            child.visit(self)
            index = self._order[child][1]
        return False

    def on_leave(self, original_node: cst.CSTNode) -> None:
        kind = type(original_node)
        plain = _PLAIN_LEAVES.get(kind)
        if plain is None:
            leave = f"leave_{kind.__name__}"  # CSTVisitor's own leave_ methods do nothing
            plain = _PLAIN_LEAVES[kind] = not issubclass(kind, _ASSIGNMENT_LIKE_NODES) and getattr(
                ScopeVisitor, leave, None
            ) is getattr(cst.CSTVisitor, leave, None)
        if plain:  # all that ScopeVisitor.on_leave does for it
            self.provider.set_metadata(original_node, self.scope)
        else:
            super().on_leave(original_node)


def module_scopes(
    module: cst.Module, order: Mapping[cst.CSTNode, SourceOrder], nodes: Sequence[cst.CSTNode]
) -> Mapping[cst.CSTNode, Optional[Scope]]:
    """The scope of every node of ``module`` that ``ScopeProvider`` gives one, the accesses
    of every scope resolved (what ``MetadataWrapper(module).resolve(ScopeProvider)`` gives);
    ``order``: the module's source order (:mod:`migrate.source_layout`), whose parent links
    give the expression contexts; ``nodes``: the nodes of ``order`` by rank."""
    scopes = _ScopeRecorder(ExpressionContexts(order))
    visitor = _InPlaceScopeVisitor(scopes, nodes, order)
    module.visit(visitor)
    visitor.infer_accesses()
    return scopes.scopes
