"""Calls of a class's own class or static methods, for diagnostics that name them.

ESPnet's trainer is never instantiated: ``run`` is a class method that hands the scaler to
another one, ``cls.train_one_epoch(model=..., scaler=scaler, ...)``. The migration follows a
scaler into plain functions of the file and into instance methods, not through ``cls.`` or
``ClassName.`` calls of class and static methods; a refusal there must say so, not that the
function is defined or called elsewhere.

:func:`own_class_method` is the class or static method such a call names (the call sits in a
method of the same class and names it through the method's first parameter or the class's
name); :func:`class_method_sites` the calls of one such method; :func:`described` the words a
diagnostic uses for it.
"""

from __future__ import annotations

from typing import List, Optional

import libcst as cst

from .names import ModuleFacts

__all__ = ["class_method_sites", "described", "own_class_method"]

_KINDS = {"classmethod": "class method", "staticmethod": "static method"}


def own_class_method(facts: ModuleFacts, call: Optional[cst.CSTNode]) -> Optional[cst.FunctionDef]:
    """The class or static method of the class around ``call`` that ``call`` names
    (``cls.f(...)``, ``self.f(...)``, ``Trainer.f(...)`` inside a method of ``Trainer``);
    None for any other call."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
        return None
    receiver = call.func.value
    method = facts.enclosing(call, (cst.FunctionDef,))
    cls = facts.enclosing(method, (cst.ClassDef,)) if method is not None else None
    if not isinstance(receiver, cst.Name) or method is None or cls is None:
        return None
    params = [*method.params.posonly_params, *method.params.params]
    if receiver.value not in {cls.name.value, *(p.name.value for p in params[:1])}:
        return None
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == call.func.attr.value:
            return statement if _kind(statement) is not None else None
    return None


def class_method_sites(facts: ModuleFacts, function: cst.FunctionDef) -> List[cst.Call]:
    """The calls of ``function`` (a class or static method) through its own class."""
    cls = facts.enclosing(function, (cst.ClassDef,))
    if cls is None or _kind(function) is None:
        return []
    return [call for call in facts.subtree(cls, cst.Call) if own_class_method(facts, call) is function]


def described(facts: ModuleFacts, function: cst.FunctionDef) -> str:
    """``"a class method of Trainer"`` for a class or static method ``function``."""
    cls = facts.enclosing(function, (cst.ClassDef,))
    owner = cls.name.value if cls is not None else "its class"
    return f"a {_kind(function)} of {owner}"


def _kind(function: cst.FunctionDef) -> Optional[str]:
    for decorator in function.decorators:
        if isinstance(decorator.decorator, cst.Name) and decorator.decorator.value in _KINDS:
            return _KINDS[decorator.decorator.value]
    return None
