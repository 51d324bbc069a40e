"""Gradient reads made inside the functions of the file that a call runs.

A helper called after the step (``log_grads(model)``, ``self.grad_stats()``) reads the
gradients as surely as the caller would inline (RPM140, :mod:`migrate.gradient_reads`).
:func:`gradient_read_in` finds the first such read a call makes: in the function of this
module it calls (by name, or ``self.name(...)`` of the enclosing class) and in the functions
that one calls, :data:`DEPTH` calls deep. Functions that run a backward or a migrated step
themselves are training code, not helpers, and are not looked into: their reads are judged
where they are, against their own backward and step.
"""

from __future__ import annotations

from typing import Optional, Set

import libcst as cst

from .names import ModuleFacts
from .plan import Plan

__all__ = ["DEPTH", "called_function", "gradient_read_in", "is_gradient_read"]

DEPTH = 3


def called_function(facts: ModuleFacts, call: cst.Call) -> Optional[cst.FunctionDef]:
    """The function of this module ``call`` runs: ``name(...)`` bound to a ``def`` in
    scope, or ``self.name(...)`` a method of the class enclosing the call; else None."""
    function = facts.local_function(call)
    if function is not None:
        return function
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
        return None
    klass = facts.enclosing(call, (cst.ClassDef,))
    if klass is None:
        return None
    for statement in klass.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == func.attr.value:
            return statement
    return None


def is_gradient_read(facts: ModuleFacts, attribute: cst.Attribute) -> bool:
    """``attribute`` reads a tensor's gradient: a ``.grad`` that is neither a target
    (``p.grad = None``) nor called (``autograd.grad(...)`` computes gradients of its own and
    reads none; a tensor's ``.grad`` is never callable)."""
    if attribute.attr.value != "grad":
        return False
    parent = facts.parent(attribute)
    if isinstance(parent, cst.AssignTarget) and parent.target is attribute:
        return False
    return not (isinstance(parent, cst.Call) and parent.func is attribute)


def gradient_read_in(facts: ModuleFacts, plan: Plan, call: cst.Call) -> Optional[cst.Attribute]:
    """The first ``.grad`` read (not a ``p.grad = ...`` target) that the helper ``call``
    runs makes, following its own calls :data:`DEPTH` deep; None when it makes none or
    is not a helper of this module (see the module's contract)."""
    return _read_in(facts, plan, call, DEPTH, set())


def _read_in(facts: ModuleFacts, plan: Plan, call: cst.Call, depth: int, seen: Set[int]) -> Optional[cst.Attribute]:
    function = called_function(facts, call)
    if function is None or id(function) in seen or _trains(facts, plan, function):
        return None
    seen.add(id(function))
    for attribute in facts.subtree(function, cst.Attribute):
        if is_gradient_read(facts, attribute):
            return attribute
    if depth <= 1:
        return None
    for inner in facts.subtree(function, cst.Call):
        found = _read_in(facts, plan, inner, depth - 1, seen)
        if found is not None:
            return found
    return None


def _trains(facts: ModuleFacts, plan: Plan, function: cst.FunctionDef) -> bool:
    """``function`` holds a backward or a statement moved into a step function."""
    statements = [*plan.backward_statements, *plan.step_statements]
    return any(facts.within(statement, function) for statement in statements)
