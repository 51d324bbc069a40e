"""Name facts the rules need, computed once per module with libcst metadata.

* which calls construct a torch GradScaler (any spelling, alias, from-import, import inside a
  function, try/except fallback), and with which positional convention;
* which ``with`` items are autocast contexts;
* where a local name is bound and read, scope by scope;
* how a function's parameters are fed by its call sites in the same file.

Pure source analysis: never imports torch.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple, Type, TypeVar, Union, cast

import libcst as cst
from libcst.metadata import (
    Assignment,
    CodePosition,
    FunctionScope,
    Scope,
)

from .scopes import module_scopes
from .source_layout import SourceOrder, module_layout

__all__ = ["ModuleFacts", "SCALER_STATE_METHODS", "SCALER_DEVICE_FIRST", "SCALER_LEGACY_CUDA", "SCALER_LEGACY_CPU"]

N = TypeVar("N", bound=cst.CSTNode)

#: Up to this many nodes, :meth:`ModuleFacts.subtree` scans a subtree node by node; a larger
#: one (a whole function or module) is read off the ranks of each node type in it.
_SCANNED_SUBTREE = 64

SCALER_DEVICE_FIRST = {"torch.amp.GradScaler", "torch.GradScaler", "torch.amp.grad_scaler.GradScaler"}
SCALER_LEGACY_CUDA = {"torch.cuda.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler"}
SCALER_LEGACY_CPU = {"torch.cpu.amp.GradScaler", "torch.cpu.amp.grad_scaler.GradScaler"}
AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.amp.autocast_mode.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.cuda.amp.autocast_mode.autocast",
}
LR_SCHEDULER_PREFIX = "torch.optim.lr_scheduler."
PARALLEL_WRAPPERS = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "apex.parallel.DistributedDataParallel",
}
#: Scaler methods that read or restore its state (or its growth settings): allowed anywhere.
SCALER_STATE_METHODS = frozenset(
    {
        "state_dict",
        "load_state_dict",
        "get_scale",
        "is_enabled",
        "get_growth_factor",
        "get_backoff_factor",
        "get_growth_interval",
        "set_growth_factor",
        "set_backoff_factor",
        "set_growth_interval",
    }
)
CLIP_FUNCTIONS = {
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
}


@dataclass(frozen=True)
class ScalerKind:
    """How a GradScaler constructor reads its positional arguments."""

    device_first: bool  # torch.amp.GradScaler(device, init_scale, ...)
    implied_device: Optional[str]  # "cuda"/"cpu" for the legacy wrappers


class ModuleFacts:
    """Metadata-backed answers about one parsed module (``wrapper.module``)."""

    def __init__(self, wrapper: cst.MetadataWrapper) -> None:
        self.module = wrapper.module
        # Positions and the source order come from one code generation of the module (no
        # batched traversal: :mod:`migrate.source_layout`).
        layout = module_layout(self.module)
        self._survey(layout.order, layout.nodes)
        self._scopes = module_scopes(self.module, layout.order, layout.nodes)
        # Qualified names are asked of a few dozen nodes: each is computed from its scope
        # when asked (what QualifiedNameProvider does for every node) and kept.
        self._qualified: Dict[cst.CSTNode, Set[str]] = {}
        self._positions = layout.positions

    def _survey(self, source: Mapping[cst.CSTNode, SourceOrder], nodes: Sequence[cst.CSTNode]) -> None:
        """What several rules look for, read off the source order: every node in
        source order with its parent and the extent of its subtree, every name, every
        ``x.backward(...)`` call, every import line (``nodes``: those of ``source`` by rank)."""
        ranks: Dict[type, List[int]] = {}
        for rank, node in enumerate(nodes):
            ranks.setdefault(type(node), []).append(rank)
        self._source = source
        self._nodes = nodes
        self._ranks = ranks
        self._types_of: Dict[object, List[type]] = {}
        self.all_names = {cast(cst.Name, nodes[rank]).value for rank in ranks.get(cst.Name, ())}
        self.backward_calls = [
            call
            for call in self._of_type(cst.Call)
            if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward"
        ]
        self.import_lines = [
            line
            for line in self._of_type(cst.SimpleStatementLine)
            if any(isinstance(s, (cst.Import, cst.ImportFrom)) for s in line.body)
        ]

    def _of_type(self, kind: Type[N]) -> List[N]:
        """Every node of exactly type ``kind``, in source order."""
        return [cast(N, self._nodes[rank]) for rank in self._ranks.get(kind, ())]

    # ------------------------------------------------------------------ basic lookups
    def qualified(self, node: cst.CSTNode) -> Set[str]:
        found = self._qualified.get(node)
        if found is None:
            scope = self._scopes.get(node)
            found = {q.name for q in scope.get_qualified_names_for(node)} if scope else set()
            self._qualified[node] = found
        return set(found)

    def subtree(self, node: cst.CSTNode, kind: Union[Type[N], Tuple[Type[N], ...]]) -> List[N]:
        """The nodes of type ``kind`` at or under ``node`` (of the parsed tree), in source
        order: what ``libcst.matchers.findall(node, m.TypeOf(kind))`` finds, without a walk."""
        start, end, _ = self._source[node]
        if end - start <= _SCANNED_SUBTREE:
            return [found for found in self._nodes[start:end] if isinstance(found, kind)]
        types = self._types_of.get(kind)
        if types is None:
            types = self._types_of[kind] = [t for t in self._ranks if issubclass(t, kind)]
        picked: List[int] = []
        for t in types:
            ranks = self._ranks[t]
            picked.extend(ranks[bisect_left(ranks, start) : bisect_left(ranks, end)])
        if len(types) > 1:
            picked.sort()
        return [cast(N, self._nodes[rank]) for rank in picked]

    def find_under(self, root: cst.CSTNode, kind: Union[Type[N], Tuple[Type[N], ...]]) -> List[N]:
        """The nodes of type ``kind`` at or under ``root`` in source order, where ``root`` may
        also be a tree made from this module by edits (what
        ``libcst.matchers.findall(root, m.TypeOf(kind))`` finds): the subtrees kept from the
        parsed tree are read off the source order, only the nodes the edits built are walked."""
        if root in self._source:
            return self.subtree(root, kind)
        found: List[N] = [root] if isinstance(root, kind) else []
        for child in root.children:
            found.extend(self.find_under(child, kind))
        return found

    def names_under(self, root: cst.CSTNode) -> Set[str]:
        """The values of the ``Name`` nodes at or under ``root``, which may also be a tree made
        from this module by edits (what ``libcst.matchers.findall(root, m.Name())`` finds):
        the subtrees it keeps from the parsed tree are read off the source order, only the
        nodes the edits built are walked."""
        found: Set[str] = set()
        pending = [root]
        while pending:
            node = pending.pop()
            if node in self._source:
                found.update(name.value for name in self.subtree(node, cst.Name))
            elif isinstance(node, cst.Name):
                found.add(node.value)
            else:
                pending.extend(node.children)
        return found

    def within(self, node: cst.CSTNode, outer: cst.CSTNode) -> bool:
        """``node`` is ``outer`` or under it."""
        start, end, _ = self._source[outer]
        return start <= self.order(node) < end

    def walk(self, root: cst.CSTNode, visit: Callable[[cst.CSTNode], bool]) -> None:
        """Call ``visit`` on ``root`` and the nodes under it in source order, skipping what is
        under a node for which it answers False (a ``CSTVisitor.on_visit`` walk, without
        rebuilding the tree the way a libcst traversal does)."""
        index, end, _ = self._source[root]
        while index < end:
            node = self._nodes[index]
            index = index + 1 if visit(node) else self._source[node][1]

    def position(self, node: cst.CSTNode) -> CodePosition:
        """Where ``node`` starts (``PositionProvider``'s start: line 1-based, column 0-based)."""
        return self._positions[node].start

    def line(self, node: cst.CSTNode) -> int:
        """1-based start line of ``node``."""
        return self.position(node).line

    def order(self, node: Optional[cst.CSTNode]) -> int:
        """Rank of ``node`` in source order (pre-order walk); -1 outside the parsed tree (or None)."""
        return self._source[node][0] if node is not None and node in self._source else -1

    def parent(self, node: Optional[cst.CSTNode]) -> Optional[cst.CSTNode]:
        """The node above ``node``; None for the module, a node outside the tree, or None
        (so that ``parent(parent(x))`` needs no check in between)."""
        return self._source[node][2] if node is not None and node in self._source else None

    def scope(self, node: cst.CSTNode) -> Optional[Scope]:
        return self._scopes.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterable[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def enclosing(self, node: cst.CSTNode, kinds: Tuple[Type[N], ...]) -> Optional[N]:
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, kinds):
                return ancestor
        return None

    def statement_of(self, node: cst.CSTNode) -> cst.BaseStatement:
        """The innermost statement (simple line or compound) containing ``node``."""
        for candidate in [node, *self.ancestors(node)]:
            if isinstance(candidate, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return candidate
        raise ValueError("node is not inside a statement")

    # -------------------------------------------------------------- what a call is
    def scaler_kind(self, call: cst.Call) -> Optional[ScalerKind]:
        """The GradScaler spelling ``call`` constructs, or None; ambiguous try/except
        fallbacks between conventions answer with the device-first one only when no
        positional argument makes the difference matter (else raise ValueError)."""
        names = self.qualified(call.func)
        kinds = []
        if names & SCALER_DEVICE_FIRST:
            kinds.append(ScalerKind(True, None))
        if names & SCALER_LEGACY_CUDA:
            kinds.append(ScalerKind(False, "cuda"))
        if names & SCALER_LEGACY_CPU:
            kinds.append(ScalerKind(False, "cpu"))
        if not kinds:
            return None
        positional = [arg.value for arg in call.args if arg.keyword is None and arg.star == ""]
        if len(set(kinds)) > 1 and positional:
            # A try/except fallback between the two conventions: a string first argument can
            # only be torch.amp's device, a number only the legacy init_scale.
            first = positional[0]
            wanted = isinstance(first, (cst.SimpleString, cst.FormattedString))
            if not wanted and not isinstance(first, (cst.Float, cst.Integer, cst.BinaryOperation)):
                raise ValueError("ambiguous GradScaler spelling")
            kinds = [k for k in kinds if k.device_first == wanted]
        return kinds[0]

    def is_autocast(self, item: cst.WithItem) -> bool:
        call = item.item
        return isinstance(call, cst.Call) and bool(self.qualified(call.func) & AUTOCAST)

    def calls_any(self, call: cst.Call, names: Set[str]) -> bool:
        return bool(self.qualified(call.func) & names)

    def calls_prefix(self, call: cst.Call, prefixes: Iterable[str]) -> bool:
        return any(name.startswith(tuple(prefixes)) for name in self.qualified(call.func))

    # ---------------------------------------------------------------- name bindings
    def assignments(self, name: str, scope: Scope) -> List[cst.CSTNode]:
        """Nodes that bind ``name`` in ``scope`` (Assign/For/param/import ... nodes)."""
        return [a.node for a in scope.assignments[name] if isinstance(a, Assignment)]

    def accesses(self, name: str, scope: Scope) -> List[cst.Name]:
        """Every read of ``name`` bound in ``scope``, nested scopes included, in source order."""
        found = {
            access.node
            for assignment in scope.assignments[name]
            for access in assignment.references
            if isinstance(access.node, cst.Name)
        }
        return sorted(found, key=self.order)

    def function_of(self, scope: object) -> Optional[cst.FunctionDef]:
        """The function whose scope ``scope`` is; None for any other (a lambda's included)."""
        node = scope.node if isinstance(scope, FunctionScope) else None
        return node if isinstance(node, cst.FunctionDef) else None

    def local_function(self, call: Optional[cst.CSTNode]) -> Optional[cst.FunctionDef]:
        """The function of this module that ``call`` (``name(...)``) calls, else None."""
        if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
            return None
        scope = self.scope(call)
        if scope is None:
            return None
        for assignment in scope[call.func.value]:
            node = getattr(assignment, "node", None)
            if isinstance(node, cst.FunctionDef):
                return node
        return None

    def call_sites(self, function: cst.FunctionDef) -> List[cst.Call]:
        """Calls of ``function`` by its plain name anywhere in the module."""
        sites: List[cst.Call] = []
        fn_scope = self.scope(function)
        if fn_scope is None:
            return sites
        for access in self.accesses(function.name.value, fn_scope):
            parent = self.parent(access)
            if isinstance(parent, cst.Call) and parent.func is access:
                sites.append(parent)
        return sites


def argument_for(
    call: cst.Call, function: cst.FunctionDef, param: str, skipped: int = 0
) -> Optional[cst.BaseExpression]:
    """The expression a call passes for ``param`` of ``function`` (positional or keyword);
    ``skipped``: leading parameters the call does not pass (1 for ``Class(...)`` calling
    ``__init__``: ``self``)."""
    names = [p.name.value for p in function.params.params[skipped:]]
    for index, arg in enumerate(call.args):
        if arg.star:
            return None
        if arg.keyword is not None:
            if arg.keyword.value == param:
                return arg.value
        elif index < len(names) and names[index] == param:
            return arg.value
    return None
