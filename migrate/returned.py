"""Objects handed back by a setup function of the module: ``return model, optimizer, scaler``
and the call sites that unpack the result (``model, optimizer, scaler = build()``).

A returned name is followed in both directions: from the ``return`` to the names every call
site binds it to (a scaler's uses, a wrapped model's checkpoints), and from such a name back
to the binding inside the function (where an optimizer is built). Only plain shapes are
followed: the call is the whole right-hand side of a one-target assignment whose target is a
name or a flat tuple of names, and the function returns the object as a name, alone or at
the same position of a flat tuple, in every ``return``.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import libcst as cst
from libcst.metadata import Scope

from .names import ModuleFacts
from .plan import Blocked
from .syntax import code

__all__ = ["returned_targets", "returned_name"]

#: position of the object in the returned tuple; None: the object is the whole return value
Position = Optional[int]


def _returns(function: cst.FunctionDef) -> List[cst.Return]:
    """The ``return`` statements of ``function`` itself (not of nested functions or classes)."""
    found: List[cst.Return] = []

    class Find(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            found.append(node)

    function.visit(Find())
    return found


def _element(value: Optional[cst.BaseExpression], position: Position) -> Optional[cst.BaseExpression]:
    """The expression at ``position`` of a flat tuple ``value`` (``value`` itself for None)."""
    if position is None:
        return value
    if not isinstance(value, cst.Tuple) or any(isinstance(e, cst.StarredElement) for e in value.elements):
        return None
    elements = value.elements
    return elements[position].value if position < len(elements) else None


def _position_in_return(facts: ModuleFacts, access: cst.BaseExpression) -> Optional[Tuple[cst.Return, Position]]:
    parent = facts.parent(access)
    if isinstance(parent, cst.Return):
        return parent, None
    if isinstance(parent, cst.Element):
        tuple_node = facts.parent(parent)
        statement = facts.parent(tuple_node) if isinstance(tuple_node, cst.Tuple) else None
        if isinstance(statement, cst.Return) and isinstance(tuple_node, cst.Tuple):
            return statement, list(tuple_node.elements).index(parent)
    return None


def _unpacked(call: cst.Call, facts: ModuleFacts) -> Optional[Tuple[cst.Assign, List[Optional[str]]]]:
    """The assignment whose whole value is ``call``, and its target names in order (one
    name: the whole result; None for an element that is not a plain name)."""
    assign = facts.parent(call)
    if not isinstance(assign, cst.Assign) or assign.value is not call or len(assign.targets) != 1:
        return None
    target = assign.targets[0].target
    if isinstance(target, cst.Name):
        return assign, [target.value]
    if isinstance(target, (cst.Tuple, cst.List)) and not any(
        isinstance(e, cst.StarredElement) for e in target.elements
    ):
        return assign, [e.value.value if isinstance(e.value, cst.Name) else None for e in target.elements]
    return None


def returned_targets(facts: ModuleFacts, access: cst.BaseExpression) -> Optional[List[Tuple[Scope, str, cst.Call]]]:
    """When ``access`` is returned by a function of this module, the (scope, name, first
    call) triples its call sites bind it to, each (scope, name) once; None when ``access`` is
    not a return value.

    Raises :class:`Blocked` (RPM105) when no call site in the module calls the function or
    one does not bind it to a plain name, so the object would go where it cannot be followed."""
    found = _position_in_return(facts, access)
    if found is None:
        return None
    statement, position = found
    function = facts.enclosing(statement, (cst.FunctionDef, cst.Lambda))
    if not isinstance(function, cst.FunctionDef):
        return None
    targets: List[Tuple[Scope, str, cst.Call]] = []
    sites = facts.call_sites(function)
    if not sites:
        raise Blocked(
            access,
            "RPM105",
            f"{code(access)!r} is returned by {function.name.value}(), which nothing in this file "
            "calls: it leaves the file where the migration cannot follow it; migrate it by hand",
        )
    for call in sites:
        if isinstance(facts.parent(call), cst.Expr):
            continue  # `build()` on its own line: the result is dropped
        unpacked = _unpacked(call, facts)
        name: Optional[str] = None
        if unpacked is not None:
            names = unpacked[1]
            if position is None and len(names) == 1:
                name = names[0]
            elif position is not None and len(names) > 1 and position < len(names):
                name = names[position]
        scope = facts.scope(call)
        if name is None or scope is None:
            raise Blocked(
                call,
                "RPM105",
                f"{code(access)!r} is returned by {function.name.value}(), but this call does not "
                "bind it to a plain name (`a, b = f()`) the migration can follow; migrate it by hand",
            )
        if all(scope is not s or name != n for s, n, _ in targets):
            targets.append((scope, name, call))
    return targets


def returned_name(facts: ModuleFacts, assign: cst.Assign, name: str) -> Optional[cst.Name]:
    """For ``name`` bound by ``assign`` from a call of a function of this module
    (``model, optimizer = build()``), the name that function returns for it, when every
    ``return`` of the function gives a plain name there and all give the same one; else None.
    A call inside the function it calls (recursion) is not followed."""
    call = assign.value
    function = facts.local_function(call)
    unpacked = _unpacked(call, facts) if isinstance(call, cst.Call) else None
    if function is None or unpacked is None or facts.within(call, function):
        return None
    names = unpacked[1]
    if name not in names or names.count(name) != 1:
        return None
    position: Position = None if len(names) == 1 else names.index(name)
    returned = [_element(r.value, position) for r in _returns(function)]
    if not returned or not all(isinstance(r, cst.Name) for r in returned):
        return None
    if len({r.value for r in returned}) != 1:  # type: ignore[union-attr]
        return None
    return returned[-1]  # type: ignore[return-value]
