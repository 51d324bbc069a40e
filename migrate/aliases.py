"""Other spellings of one object in one scope: ``amp_scaler = state["scaler"]``.

A step may reach its scaler under two spellings, the one its backward uses and a plain-name
alias bound from it (or the reverse). Such an alias is the same object only while neither
side is bound again, so only names bound once in the scope, by a plain one-target
assignment from the other spelling, count.
"""

from __future__ import annotations

from typing import FrozenSet, List, Set, Tuple

import libcst as cst

from .names import ModuleFacts
from .syntax import dotted

__all__ = ["spellings"]


def spellings(facts: ModuleFacts, reference: str, at: cst.CSTNode) -> FrozenSet[str]:
    """``reference`` and every spelling of the object it names at ``at`` through aliases
    bound once in the scope of ``at`` (``alias = reference``, ``reference = source``),
    followed transitively."""
    scope = facts.scope(at)
    if scope is None:
        return frozenset({reference})
    pairs: List[Tuple[str, str]] = []  # (alias name, the spelling it is bound from)
    for assignment in scope.assignments:
        target = getattr(assignment, "node", None)
        statement = facts.parent(target) if isinstance(target, cst.Name) else None
        node = facts.parent(statement) if statement is not None else None
        if len(scope.assignments[assignment.name]) != 1 or not isinstance(node, cst.Assign):
            continue
        if len(node.targets) == 1 and node.targets[0].target is target:
            source = dotted(node.value)
            holder = source.partition(".")[0].partition("[")[0] if source is not None else ""
            if source is not None and (holder == source or len(scope.assignments[holder]) <= 1):
                pairs.append((assignment.name, source))
    found: Set[str] = {reference}
    grown = True
    while grown:
        grown = False
        for alias, source in pairs:
            if (alias in found) != (source in found):
                found |= {alias, source}
                grown = True
    return frozenset(found)
