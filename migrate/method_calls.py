"""The calls of a trainer's method, for following what its parameters are handed.

A trainer's step method is often handed the optimizer: ``def train_step(self, batch,
optimizer)``, called as ``self.train_step(batch, self.optimizer)`` from the class's loop or
as ``trainer.train_step(batch, optimizer)`` by the script. What the parameter holds is what
those calls pass, as for a function's parameter (:mod:`migrate.origins`), once every call of
the method is known.

:func:`method_call_sites` finds them: each use of the method's name as an attribute in the
module must be a call on the instance parameter of a method of the class's family
(``self.train_step(...)``) or on a name bound only to constructions of a class of the
family (``trainer = Trainer(...)``); no other class of the module defines a method of that
name, and no string names it (``getattr(self, "train_step")``). Anything else is
:class:`~migrate.plan.Blocked` (RPM108), naming the use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst
from libcst.metadata import Assignment

from .optimizer_writes import is_scheduler, may_run_after, optimizer_writes
from .plan import Blocked
from .syntax import code

if TYPE_CHECKING:
    from .attributes import InstanceFamily
    from .torch_amp import TorchAmpRules

__all__ = ["check_passing_caller", "method_call_sites"]

_CODE = "RPM108"


def method_call_sites(rules: "TorchAmpRules", function: cst.FunctionDef) -> Optional[List[cst.Call]]:
    """Every call of ``function`` when it is a method of a class of the module (each passes
    the instance implicitly: its arguments start at the second parameter); None when it is
    not a method."""
    facts = rules.facts
    if rules.attributes.receiver_of(function) is None:
        return None
    owner = facts.parent(facts.parent(function))
    assert isinstance(owner, cst.ClassDef)
    family = rules.attributes.family_of_class(owner)
    name = function.name.value
    for cls in facts.subtree(facts.module, cst.ClassDef):
        for statement in cls.body.body:
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name and statement is not function:
                raise Blocked(
                    statement,
                    _CODE,
                    f"{cls.name.value} defines {name}() too, so which one a call runs, and what "
                    f"{owner.name.value}.{name}() is handed, cannot be told; left untouched",
                )
    for string in facts.subtree(facts.module, cst.SimpleString):
        if string.evaluated_value == name:
            raise Blocked(string, _CODE, f"{code(string)} may name {owner.name.value}.{name}(); left untouched")
    sites: List[cst.Call] = []
    for attribute in facts.subtree(facts.module, cst.Attribute):
        if attribute.attr.value != name:
            continue
        call = facts.parent(attribute)
        if isinstance(call, cst.Call) and call.func is attribute and _on_instance(rules, family, attribute.value):
            sites.append(call)
            continue
        raise Blocked(
            attribute,
            _CODE,
            f"`{code(facts.statement_of(attribute)).strip()}` uses `.{name}` other than as a call on a "
            f"{owner.name.value} instance, so what {name}() is handed cannot be followed; left untouched",
        )
    return sites


def _on_instance(rules: "TorchAmpRules", family: "InstanceFamily", receiver: cst.BaseExpression) -> bool:
    """``receiver`` is the instance parameter of a family method, or a name bound only to
    constructions of the family's classes."""
    if not isinstance(receiver, cst.Name):
        return False
    method = rules.attributes.method_of_receiver(receiver)
    if method is not None:
        return method in family.methods
    scope = rules.facts.scope(receiver)
    bindings = [a for a in scope[receiver.value] if isinstance(a, Assignment)] if scope is not None else []
    values = [_assigned_value(rules, a) for a in bindings]
    return bool(values) and all(isinstance(v, cst.Call) and rules.attributes.constructs(v, family) for v in values)


def _assigned_value(rules: "TorchAmpRules", assignment: Assignment) -> Optional[cst.BaseExpression]:
    node = assignment.node
    parent = rules.facts.parent(node) if isinstance(node, cst.CSTNode) else None
    statement = rules.facts.parent(parent) if isinstance(parent, cst.AssignTarget) else None
    if isinstance(statement, cst.Assign) and len(statement.targets) == 1 and statement.targets[0].target is node:
        return statement.value
    return None


def check_passing_caller(rules: "TorchAmpRules", site: cst.Call, function: cst.FunctionDef, passed: cst.Name) -> None:
    """In the asynchronous form, :class:`Blocked` when the function (or module) around
    ``site``, a call of the method ``function`` handing it ``passed``, writes the state of
    what ``passed`` holds, or steps a scheduler, where it may run after the call (the
    step's own rules do not order writes beside a method call that hands the optimizer)."""
    facts = rules.facts
    if rules.exact:
        return
    caller = facts.enclosing(site, (cst.FunctionDef,))
    statement = facts.statement_of(site)
    writes = optimizer_writes(
        facts,
        caller or facts.module,
        passed.value,
        lambda owner, at: is_scheduler(rules, owner, at, unbound=True),
        {statement},
        {function.name.value},
    )
    late = [w for w in writes if may_run_after(facts, w, statement)]
    if late:
        raise Blocked(
            late[0],
            _CODE,
            f"`{code(late[0]).strip()}` touches optimizer state after `{code(site)}`, whose step runs on the "
            "optimizer thread, with nothing ordering the two asynchronously (the optimizer reaches the step "
            "as a method's parameter); use --exact or migrate it by hand",
        )
