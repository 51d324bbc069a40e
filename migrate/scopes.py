"""libcst's scope analysis of a module, without the extra full-tree traversal its resolution costs.

``MetadataWrapper.resolve(ScopeProvider)`` resolves ``ExpressionContextProvider`` in one
batched traversal, then makes a second batched traversal of the whole tree for
``ScopeProvider`` alone, whose only work is in ``visit_Module`` (it starts libcst's
``ScopeVisitor``). A libcst traversal rebuilds every node and costs about as much as parsing
the file; :func:`module_scopes` runs the same ``ScopeVisitor`` on the module directly, over
expression contexts resolved in a traversal the caller makes anyway, so the scopes are the
ones ``ScopeProvider`` computes, node for node.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, cast

import libcst as cst
from libcst.metadata import ExpressionContext, ExpressionContextProvider, Scope, ScopeProvider
from libcst.metadata.scope_provider import ScopeVisitor

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
    module: cst.Module, contexts: Mapping[cst.CSTNode, ExpressionContext]
) -> Mapping[cst.CSTNode, Optional[Scope]]:
    """The scope of every node of ``module`` that ``ScopeProvider`` gives one, the accesses
    of every scope resolved (``contexts``: ``ExpressionContextProvider``'s result for
    ``module``)."""
    recorder = _ScopeRecorder(contexts)
    visitor = ScopeVisitor(recorder)
    module.visit(visitor)
    visitor.infer_accesses()
    return recorder.scopes
