"""libcst's scope analysis of a module, without the full-tree traversals its resolution adds.

``MetadataWrapper.resolve(ScopeProvider)`` makes two batched traversals of the whole tree:
one for ``ExpressionContextProvider`` and one for ``ScopeProvider``, each of which only starts
a visitor of its own from ``visit_Module`` (a libcst traversal rebuilds every node and costs
about as much as parsing the file). :func:`module_scopes` runs those two visitors,
``ExpressionContextVisitor`` and ``ScopeVisitor``, on the module directly, so the scopes are
the ones ``ScopeProvider`` computes, node for node, at two traversals fewer.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, cast

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider, Scope, ScopeProvider
from libcst.metadata.expression_context_provider import ExpressionContextVisitor
from libcst.metadata.scope_provider import ScopeVisitor

__all__ = ["module_scopes"]


class _ContextRecorder(ExpressionContextProvider):
    """An ``ExpressionContextProvider`` that ``ExpressionContextVisitor`` reports to outside
    a batched traversal: it keeps the context recorded for each node."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: Dict[cst.CSTNode, ExpressionContext] = {}

    def set_metadata(self, node: cst.CSTNode, value: object) -> None:
        self.contexts[node] = cast(ExpressionContext, value)


class _ScopeRecorder(ScopeProvider):
    """A ``ScopeProvider`` that ``ScopeVisitor`` reports to outside a batched traversal: it
    reads the given expression contexts and keeps the scope recorded for each node."""

    def __init__(self, contexts: Mapping[cst.CSTNode, ExpressionContext]) -> None:
        super().__init__()
        self.metadata = {ExpressionContextProvider: contexts}
        self.scopes: Dict[cst.CSTNode, Optional[Scope]] = {}

    def set_metadata(self, node: cst.CSTNode, value: object) -> None:
        self.scopes[node] = cast(Optional[Scope], value)


def module_scopes(module: cst.Module) -> Mapping[cst.CSTNode, Optional[Scope]]:
    """The scope of every node of ``module`` that ``ScopeProvider`` gives one, the accesses
    of every scope resolved (what ``MetadataWrapper(module).resolve(ScopeProvider)`` gives)."""
    contexts = _ContextRecorder()
    module.visit(ExpressionContextVisitor(contexts, ExpressionContext.LOAD))
    scopes = _ScopeRecorder(contexts.contexts)
    visitor = ScopeVisitor(scopes)
    module.visit(visitor)
    visitor.infer_accesses()
    return scopes.scopes
