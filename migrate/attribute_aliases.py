"""Local names a trainer method binds from instance attributes (issue 10, shape 1).

Real trainers often read their objects into locals first and write the step on those::

    def train_step(self, batch):
        optimizer = self.optimizer          # or: opt, sched = self.opt, self.sched
        ...
        scaler.step(optimizer)

Such a local is the attribute's object for as long as neither is bound again. Only a name
bound once in its function's scope, by a plain one-target assignment whose value (or whose
element at the name's position, for a tuple unpacking a tuple of the same length) is
``receiver.attribute`` with ``receiver`` the method's instance parameter, counts; the
origins of the optimizer are then the attribute's (:mod:`migrate.origins`).

The reverse also holds in ``__init__``: ``self.model = model`` and an optimizer built on the
constructor's parameter (``self.opt = Adam(model.parameters())``) train the attribute's object
(:func:`migrate.constructor_alias.constructor_alias`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst
from libcst.metadata import Assignment

from .plan import Binding, Blocked

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .torch_amp import TorchAmpRules

__all__ = ["aliased_attribute", "element_for", "local_aliases", "unpacked_into"]


def aliased_attribute(rules: "TorchAmpRules", binding: Binding) -> Optional[str]:
    """``"self.optimizer"`` when ``binding`` (a plain name's) is the only binding of its name
    in its scope and takes an instance attribute (``optimizer = self.optimizer``,
    ``opt, sched = self.opt, self.sched``); else None."""
    statement, value = binding.statement, binding.value
    scope = rules.facts.scope(statement) if statement is not None else None
    if "." in binding.name or scope is None or value is None:
        return None
    assignments = [a for a in scope[binding.name] if isinstance(a, Assignment)]
    if len(assignments) != 1 or not isinstance(assignments[0].node, cst.Name):
        return None
    element = element_for(assignments[0].node, rules, value)
    if not isinstance(element, cst.Attribute):
        return None
    return rules.attributes.reference(element)


def element_for(target: cst.Name, rules: "TorchAmpRules", value: cst.BaseExpression) -> Optional[cst.BaseExpression]:
    """The part of ``value`` that ``target`` is bound to: all of it for ``name = value``, the
    element at the same position for ``a, b = x, y``; None for any other shape."""
    parent = rules.facts.parent(target)
    if isinstance(parent, cst.AssignTarget):
        return value
    element = parent
    targets = rules.facts.parent(element) if isinstance(element, cst.Element) else None
    if not isinstance(targets, cst.Tuple) or not isinstance(rules.facts.parent(targets), cst.AssignTarget):
        return None
    values = value.elements if isinstance(value, cst.Tuple) else None
    if (
        values is None
        or len(values) != len(targets.elements)
        or any(isinstance(e, cst.StarredElement) for e in (*values, *targets.elements))
    ):
        return None
    return values[list(targets.elements).index(element)].value  # type: ignore[arg-type]


def unpacked_into(facts: "ModuleFacts", value: cst.BaseExpression) -> Optional[cst.Name]:
    """The name ``value`` is bound to when it is an element of a tuple unpacked into a tuple
    of names of the same length (``model, scaler = self.model, self.scaler``: ``scaler``
    for ``self.scaler``); None for any other shape (a starred element, an attribute target)."""
    element = facts.parent(value)
    values = facts.parent(element)
    assign = facts.parent(values)
    if not (isinstance(element, cst.Element) and isinstance(values, cst.Tuple) and isinstance(assign, cst.Assign)):
        return None
    if assign.value is not values or len(assign.targets) != 1 or not isinstance(assign.targets[0].target, cst.Tuple):
        return None
    targets = assign.targets[0].target.elements
    if len(targets) != len(values.elements) or any(
        isinstance(e, cst.StarredElement) for e in (*values.elements, *targets)
    ):
        return None
    target = targets[list(values.elements).index(element)].value
    return target if isinstance(target, cst.Name) else None


def local_aliases(rules: "TorchAmpRules", at: cst.CSTNode, reference: str) -> List[str]:
    """The locals of the function around ``at`` that :func:`aliased_attribute` makes
    ``reference`` (``model`` for ``"self.model"`` after ``model = self.model``)."""
    scope = rules.facts.scope(at)
    names = sorted({a.name for a in scope.assignments if isinstance(a, Assignment)}) if scope is not None else []
    found = []
    for name in names:
        try:
            binding = rules.binding(name, at)
        except Blocked:
            continue
        if aliased_attribute(rules, binding) == reference:
            found.append(name)
    return found
