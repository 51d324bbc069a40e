"""Names of the wrapped model's parameters, buffers and modules read on the main thread.

``RoundPipe`` holds the user's module as ``model.model``, so its ``named_parameters()``,
``named_buffers()``, ``named_modules()`` and ``named_children()`` carry a ``model.`` prefix
(or name the wrapper itself) that the original's did not. Code keyed on those names (an EMA
that matches ``dict(ema.named_parameters())`` against the model's, a layer id parsed from a
name) would see other names, or fail. Outside the step, these reads go to the wrapped module
(``model.named_parameters()`` -> ``model.model.named_parameters()``): the same tensors
under the original's names, as ``state_dict`` already does. Inside a step function (moved
statements, and the functions of the file they call) they are left alone: there RoundPipe's
own ``named_parameters()`` yields the optimizer copies, which the wrapped module does not. So
are the reads in a function of the file some call of which has an argument rewritten (an
optimizer helper already handed ``model.model``): what it gets may be the module itself.
"""

from __future__ import annotations

from typing import List, Set

import libcst as cst

from .helper_reads import DEPTH, called_function
from .names import ModuleFacts
from .plan import Plan

__all__ = ["NAMED_ITERATORS", "keeps_wrapper_names"]

#: methods of a module whose items carry the module's own names
NAMED_ITERATORS = frozenset({"named_parameters", "named_buffers", "named_modules", "named_children"})


def keeps_wrapper_names(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """A ``named_*()`` read at ``node`` stays as written: it runs in a step function
    (:func:`runs_in_step`), or in a function of the file handed a rewritten argument."""
    return runs_in_step(facts, plan, node) or _handed_rewritten_argument(facts, plan, node)


def _handed_rewritten_argument(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """The function holding ``node`` is called with an argument the plan rewrites (or inside
    an expression it replaces), or from a function of which that holds, outwards."""
    function = facts.enclosing(node, (cst.FunctionDef,))
    pending = [function] if function is not None else []
    seen: Set[int] = set()
    calls = [(call, called_function(facts, call)) for call in facts.subtree(facts.module, cst.Call)] if pending else []
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        for call, called in calls:
            if called is not current:
                continue
            if any(arg.value in plan.edits.expressions for arg in call.args) or any(
                ancestor in plan.edits.expressions for ancestor in (call, *facts.ancestors(call))
            ):
                return True
            caller = facts.enclosing(call, (cst.FunctionDef,))
            if caller is not None:
                pending.append(caller)
    return False


def runs_in_step(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """``node`` is part of a statement moved into a step function, or of a function of the
    file that such a statement calls (:data:`DEPTH` calls deep)."""
    if any(facts.within(node, statement) for statement in plan.step_statements):
        return True
    function = facts.enclosing(node, (cst.FunctionDef,))
    if function is None:
        return False
    seen: Set[int] = set()
    frontier: List[cst.CSTNode] = list(plan.step_statements)
    for _ in range(DEPTH):
        reached: List[cst.CSTNode] = []
        for holder in frontier:
            for call in facts.subtree(holder, cst.Call):
                called = called_function(facts, call)
                if called is None or id(called) in seen:
                    continue
                if called is function:
                    return True
                seen.add(id(called))
                reached.append(called)
        frontier = reached
    return False
