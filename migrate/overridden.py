"""A base class's method that no instance the program builds runs: overridden in each.

detectron2's ``SimpleTrainer.run_step`` trains without AMP (``losses.backward()``,
``self.optimizer.step()``); ``AMPTrainer(SimpleTrainer)`` overrides it with the AMP step.
When the program builds only ``AMPTrainer``, the base's step never runs: its plain
backward is no second training loop of the wrapped model, and stays as written.

:func:`never_runs` decides it from the module: the method's class and its family are
named only to build them or as bases (:func:`migrate.inherited_init.constructions`), at
least one instance is built, the method resolution order of every class built finds the
method's name in another class first (a class the module defines), and nothing reads the
method otherwise (``super().run_step()``, ``SimpleTrainer.run_step``, ``getattr``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from .inherited_init import Lineages, built_class, constructions
from .plan import Blocked

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .torch_amp import TorchAmpRules

__all__ = ["never_runs"]


def never_runs(rules: "TorchAmpRules", node: cst.CSTNode) -> bool:
    """``node`` is in a method that no instance built in the module runs (overridden in
    every class built, never reached through ``super()`` or the class)."""
    facts = rules.facts
    method = facts.enclosing(node, (cst.FunctionDef,))
    while method is not None and rules.attributes.receiver_of(method) is None:
        method = facts.enclosing(method, (cst.FunctionDef,))
    owner = facts.parent(facts.parent(method)) if method is not None else None
    if method is None or not isinstance(owner, cst.ClassDef):
        return False
    family = rules.attributes.family_of_class(owner)
    name = method.name.value
    try:
        sites = constructions(facts, family, owner)
    except Blocked:
        return False
    lineages = Lineages(facts, family)
    for site in sites:
        try:
            order = lineages.order(built_class(facts, family, site), site)
        except Blocked:
            return False
        definer = next((entry for entry in order if isinstance(entry, str) or _defines(entry, name)), None)
        if definer is None or isinstance(definer, str) or definer is owner:
            return False
    if not sites:
        return False
    named = [n for n in facts.subtree(facts.module, cst.Name) if n.value == name]
    strings = [s for s in facts.subtree(facts.module, cst.SimpleString) if s.evaluated_value == name]  # getattr
    return not strings and all(_defined(facts, n) or _called_on_instance(facts, n) for n in named)


def _defines(cls: cst.ClassDef, name: str) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in cls.body.body)


def _defined(facts: "ModuleFacts", name: cst.Name) -> bool:
    """``name`` is what a ``def`` defines."""
    parent = facts.parent(name)
    return isinstance(parent, cst.FunctionDef) and parent.name is name


def _called_on_instance(facts: "ModuleFacts", name: cst.Name) -> bool:
    """``self.run_step`` (or ``trainer.run_step``): looked up on an instance, so in the
    class built; not ``super().run_step`` nor ``Base.run_step``."""
    attribute = facts.parent(name)
    if not (isinstance(attribute, cst.Attribute) and attribute.attr is name and isinstance(attribute.value, cst.Name)):
        return False
    scope = facts.scope(attribute.value)
    bindings = scope[attribute.value.value] if scope is not None else ()
    return not any(isinstance(getattr(a, "node", None), cst.ClassDef) for a in bindings)
