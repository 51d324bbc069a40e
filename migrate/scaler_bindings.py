"""Why a scaler name that scales a loss was not followed back to a GradScaler, from its bindings.

A backward ``scaler.scale(loss).backward()`` whose ``scaler`` the migration did not follow
to a torch GradScaler is refused (RPM104); the diagnostic must name the binding that
stopped it, not guess. :func:`unfollowed_binding` reads the bindings of the name where the
backward reads it: an expression holding a GradScaler in only some of its parts
(``GradScaler() if amp else NoScaler()``), the result of a call the migration does not
follow, a parameter whose callers' arguments are not followed.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.metadata import Assignment

from .names import ModuleFacts
from .syntax import code

__all__ = ["built_other_part", "unfollowed_binding"]


def unfollowed_binding(facts: ModuleFacts, owner: cst.Name) -> Optional[str]:
    """What binds ``owner`` (a read of a scaler name) so that it was not followed, in words;
    None when no binding says more than that the name was not followed."""
    scope = facts.scope(owner)
    if scope is None:
        return None
    for assignment in scope[owner.value]:
        node = assignment.node if isinstance(assignment, Assignment) else None
        if isinstance(node, cst.Param):
            function = facts.enclosing(node, (cst.FunctionDef,))
            called = f"{function.name.value}()" if function is not None else "its function"
            return f"it is a parameter of {called}, and what its callers here pass is not followed to a GradScaler"
        target = facts.parent(node) if node is not None else None
        assign = facts.parent(target)
        if not (isinstance(target, cst.AssignTarget) and isinstance(assign, cst.Assign)):
            continue
        value, line = assign.value, facts.line(assign)
        if _holds_scaler(facts, value) and not (isinstance(value, cst.Call) and _builds_scaler(facts, value)):
            other = built_other_part(facts, value)
            held = f" (`{code(other)}` is not a torch GradScaler)" if other is not None else ""
            return (
                f"line {line} binds it to `{code(value)}`, which builds a GradScaler in only some of its "
                f"parts{held}; build a GradScaler in every branch (`GradScaler(enabled=False)` for the plain path)"
            )
        if isinstance(value, cst.Call) and not _builds_scaler(facts, value):
            return f"line {line} binds it to the result of `{code(value.func)}(...)`, not followed to a GradScaler"
    return None


def built_other_part(facts: ModuleFacts, value: cst.BaseExpression) -> Optional[cst.Call]:
    """The first branch of ``value`` (a conditional or boolean expression, nested ones
    included) that builds something other than a GradScaler here (``NoScaler()``); None
    when no branch is such a call (a name handed in, ``None``)."""
    if isinstance(value, cst.IfExp):
        parts = [value.body, value.orelse]
    elif isinstance(value, cst.BooleanOperation):
        parts = [value.left, value.right]
    else:
        return value if isinstance(value, cst.Call) and not _builds_scaler(facts, value) else None
    found = (built_other_part(facts, part) for part in parts)
    return next((call for call in found if call is not None), None)


def _holds_scaler(facts: ModuleFacts, value: cst.BaseExpression) -> bool:
    return any(_builds_scaler(facts, call) for call in facts.subtree(value, cst.Call))


def _builds_scaler(facts: ModuleFacts, call: cst.Call) -> bool:
    try:
        return facts.scaler_kind(call) is not None
    except ValueError:  # an ambiguous spelling: a GradScaler still
        return True
