"""libcst's scope analysis of a module, without the full-tree traversals its resolution adds.

``MetadataWrapper.resolve(ScopeProvider)`` makes two batched traversals of the whole tree:
one for ``ExpressionContextProvider`` and one for ``ScopeProvider``, each of which only starts
a visitor of its own from ``visit_Module`` (a libcst traversal rebuilds every node and costs
about as much as parsing the file). :func:`module_scopes` runs ``ScopeVisitor`` on the module
directly and hands it the expression contexts it asks for (whether a name is stored) from
:class:`migrate.expression_contexts.ExpressionContexts`, which works them out from the nodes
above the name instead of walking the module. The scopes are the ones ``ScopeProvider``
computes, node for node, at two traversals fewer and without ``ExpressionContextVisitor``'s.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, cast

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider, Scope, ScopeProvider
from libcst.metadata.scope_provider import ScopeVisitor

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


def module_scopes(
    module: cst.Module, order: Mapping[cst.CSTNode, SourceOrder]
) -> Mapping[cst.CSTNode, Optional[Scope]]:
    """The scope of every node of ``module`` that ``ScopeProvider`` gives one, the accesses
    of every scope resolved (what ``MetadataWrapper(module).resolve(ScopeProvider)`` gives);
    ``order``: the module's source order (:mod:`migrate.source_layout`), whose parent links
    give the expression contexts."""
    scopes = _ScopeRecorder(ExpressionContexts(order))
    visitor = ScopeVisitor(scopes)
    module.visit(visitor)
    visitor.infer_accesses()
    return scopes.scopes
