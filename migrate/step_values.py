"""Gradient norms inside the optimizer step: measured, clipped under a condition, returned.

Real steps measure the gradient norm between the backward and ``scaler.step``
(``grad_norm = clip_grad_norm_(model.parameters(), clip)``, ``norm = grad_norm_of(
model.parameters()) / scaler.get_scale()``), often under ``if clip > 0: ... else: ...``,
and the norm leaves the step: logged, returned with the loss. Such statements move into the
step function with the rest of the optimizer work, measuring the optimizer copies (which hold
the gradients once ``model.step`` has handed them over: ``model.parameters()`` becomes
``model.optim_parameters()``). A name they bind that is read outside the step is declared
``nonlocal``/``global`` in the step function, and that step runs synchronously
(``is_async=False``), so the main thread reads the value of this iteration's step, never a
stale one or one being written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .names import CLIP_FUNCTIONS
from .parameter_reads import takes_weights_out
from .syntax import PARAMETERS_CALL, method_call, names_outside, only_assignment, written_and_read

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = [
    "GUARDABLE",
    "EscapingValues",
    "branches",
    "classify_value_statement",
    "escaping_values",
    "on_copies",
]

#: step statements an ``if`` (with or without ``else``) may hold alone
GUARDABLE = frozenset({"unscale", "clip", "measure"})


def branches(statement: cst.If) -> List[List[cst.BaseStatement]]:
    """The statement lists of every branch of an ``if``/``elif``/``else`` chain (empty for a
    branch that is not an indented block)."""
    found: List[List[cst.BaseStatement]] = []
    node = statement
    while True:
        found.append(_statements(node.body))
        if isinstance(node.orelse, cst.If):
            node = node.orelse
            continue
        if isinstance(node.orelse, cst.Else):
            found.append(_statements(node.orelse.body))
        return found


def _statements(block: cst.BaseSuite) -> List[cst.BaseStatement]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else []


def classify_value_statement(builder: "StepBuilder", statement: cst.BaseStatement) -> Optional[str]:
    """``"measure"`` for ``name = <a clip call, or a call given model.parameters()>``;
    ``"guarded"`` for an ``if`` with an ``else`` or ``elif`` whose every branch holds only
    unscale/clip/measure statements; else None (the caller's own classification)."""
    if isinstance(statement, cst.If) and statement.orelse is not None:
        parts = branches(statement)
        if all(parts) and all(builder.classify(s) in GUARDABLE for part in parts for s in part):
            return "guarded"
        return None
    assign = only_assignment(statement)
    if assign is None or not all(isinstance(t.target, cst.Name) for t in assign.targets):
        return None
    value = assign.value
    calls = m.findall(value, m.Call())
    if any(isinstance(c, cst.Call) and builder.facts.calls_any(c, CLIP_FUNCTIONS) for c in calls):
        return "measure"
    given_parameters = m.Call(args=[m.ZeroOrMore(), m.Arg(value=PARAMETERS_CALL), m.ZeroOrMore()])
    measures = [c for c in m.findall(value, given_parameters) if not takes_weights_out(c, value)]
    return "measure" if measures else None


def on_copies(builder: "StepBuilder", statement: cst.BaseStatement, model: str) -> None:
    """``model.parameters()`` in a moved statement measures the optimizer copies."""
    for call in m.findall(statement, m.Call(func=m.Attribute(attr=m.Name("parameters")))):
        if not method_call(call, model, "parameters"):  # `model` may be dotted (`self.model`)
            continue
        assert isinstance(call, cst.Call)
        builder.rules.plan.edits.replace_expression(
            call.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
        )


@dataclass(frozen=True)
class EscapingValues:
    """Names the step statements bind that are read outside the step: ``declaration`` opens
    the step function (``nonlocal``/``global``), ``bindings`` go before it for names the
    enclosing function would no longer bind anywhere else."""

    names: Tuple[str, ...]
    declaration: Optional[cst.SimpleStatementLine]
    bindings: Tuple[cst.SimpleStatementLine, ...]


def escaping_values(builder: "StepBuilder", statements: Sequence[cst.BaseStatement]) -> EscapingValues:
    """What the step function must declare so the values its ``measure`` statements bind,
    and those the other work of an ``if`` chosen by the norm binds (counters), reach the main
    thread (``statements``: the step's own, nested ones included)."""
    facts = builder.facts
    written: List[str] = []
    for statement in statements:
        if builder.classify(statement) in ("measure", None):  # None: work beside the step in its `if`
            written += sorted(_bound(statement) - set(written))
    if not written:
        return EscapingValues((), None, ())
    home = statements[0] if statements else builder.backward  # the step's own method, if split
    function = facts.enclosing(home, (cst.FunctionDef,))
    root = function if isinstance(function, cst.FunctionDef) else facts.module
    moved: Set[cst.CSTNode] = set(statements)
    outside = names_outside(facts, root, moved)
    names = tuple(n for n in written if n in outside)
    if not names:
        return EscapingValues((), None, ())
    if not isinstance(function, cst.FunctionDef):
        return EscapingValues(names, cst.parse_statement(f"global {', '.join(names)}\n"), ())  # type: ignore[arg-type]
    scope = facts.scope(home)
    unbound = [
        n
        for n in names
        if scope is None
        or not any(not _under(facts, a.node, moved) for a in scope.assignments[n] if isinstance(a, Assignment))
    ]
    bindings = tuple(cst.parse_statement(f"{n} = None\n") for n in unbound)
    declaration = cst.parse_statement(f"nonlocal {', '.join(names)}\n")
    return EscapingValues(names, declaration, bindings)  # type: ignore[arg-type]


def _bound(statement: cst.BaseStatement) -> Set[str]:
    """The names a simple statement, or the simple statements of an ``if`` chain, bind."""
    if isinstance(statement, cst.SimpleStatementLine):
        return written_and_read(statement)[0]
    if isinstance(statement, cst.If):
        return {name for part in branches(statement) for inner in part for name in _bound(inner)}
    return set()


def _under(facts, node: object, statements: set) -> bool:
    return isinstance(node, cst.CSTNode) and any(a in statements for a in [node, *facts.ancestors(node)])
