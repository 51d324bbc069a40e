"""A trainer's model and optimizer used through an instance from outside its class.

The script that drives a trainer class reads what its step works on between calls:
``trainer.optimizer.param_groups[0]["lr"]``, ``trainer.model.parameters()``,
``torch.save({"model": trainer.model.state_dict(), "opt": trainer.optimizer.state_dict()})``.
The class's methods get their own treatment from the rules (``self.model`` reads:
:mod:`migrate.model_uses`; ``self.optimizer`` writes: :mod:`migrate.optimizer_writes`);
such a use from outside gets exactly the same, through the instance: the model read as
``trainer.model`` (``trainer.model.model.state_dict()``, ``trainer.model.synchronize()``
before a read of its weights), the optimizer's state touched after
``trainer.model.synchronize()`` in the asynchronous form.

Only a name that the code holding it binds to a construction of the class, and nothing
else (``trainer = Trainer(model, cfg)``), is followed: an instance reached through a
container (``runs[0].optimizer``), a parameter (a function handed the instance), or another
object's attribute may be anything, and its uses stay refused (RPM120), as does
``getattr(trainer, name)``. :func:`step_objects` names the attributes whose outside uses
are deferred this way (:meth:`migrate.attributes.InstanceFamily.follow` refuses them at
the end when no rule claimed them); :func:`optimizer_statements` finds the statements of
an optimizer's outside uses that :func:`migrate.optimizer_writes.optimizer_writes` orders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set

import libcst as cst
from libcst.metadata import Assignment

from .instance_state import STEPPING
from .optimizer_writes import optimizer_writes
from .plan import Blocked
from .syntax import code, only_assignment

if TYPE_CHECKING:
    from .attributes import InstanceFamily

__all__ = ["built_instance", "getattr_reads", "optimizer_statements", "step_objects", "step_optimizers"]


def step_optimizers(family: "InstanceFamily") -> Dict[str, FrozenSet[str]]:
    """The attributes of ``family`` holding its steps' optimizers (the argument of a
    ``.step(self.x)``/``.unscale_(self.x)`` call), each with the attributes its bindings
    read (``self.model`` of ``self.optimizer = SGD(self.model.parameters())``)."""
    optimizers: Dict[str, Set[str]] = {}
    for cls in family.classes:
        for call in family.facts.subtree(cls, cst.Call):
            if isinstance(call.func, cst.Attribute) and call.func.attr.value in STEPPING and call.args:
                attribute = _own_attribute(family, call.args[0].value)
                if attribute is not None:
                    optimizers.setdefault(attribute, set())
    for cls in family.classes:
        for assign in family.facts.subtree(cls, cst.Assign):
            bound_here = {a for t in assign.targets if (a := _own_attribute(family, t.target)) is not None}
            for bound in bound_here & set(optimizers):
                reads = family.facts.subtree(assign.value, cst.Attribute)
                optimizers[bound] |= {a for node in reads if (a := _own_attribute(family, node)) is not None}
    return {optimizer: frozenset(reads) for optimizer, reads in optimizers.items()}


def step_objects(family: "InstanceFamily") -> FrozenSet[str]:
    """The optimizers of :func:`step_optimizers` and what their bindings read (the models):
    the attributes whose uses through a built instance rules may claim."""
    optimizers = family.step_optimizers
    return frozenset(optimizers).union(*optimizers.values())


def _own_attribute(family: "InstanceFamily", node: cst.CSTNode) -> Optional[str]:
    """``x`` for ``self.x`` read through an instance parameter of ``family``, else None."""
    return node.attr.value if isinstance(node, cst.Attribute) and family.through_receiver(node) else None


def built_instance(family: "InstanceFamily", value: cst.BaseExpression) -> bool:
    """``value`` is a name whose every binding in its scope is one plain assignment of a
    construction of a class of ``family`` (``trainer = Trainer(model, cfg)``)."""
    if not isinstance(value, cst.Name):
        return False
    scope = family.facts.scope(value)
    assignments = list(scope[value.value]) if scope is not None else []
    if not assignments:
        return False
    for assignment in assignments:
        node = assignment.node if isinstance(assignment, Assignment) else None
        small = only_assignment(family.facts.statement_of(node)) if isinstance(node, cst.CSTNode) else None
        if small is None or len(small.targets) != 1 or small.targets[0].target is not node:
            return False
        if not (isinstance(small.value, cst.Call) and family.resolver.constructs(small.value, family)):
            return False
    return True


def optimizer_statements(
    family: "InstanceFamily", uses: List[cst.Attribute]
) -> Dict[cst.BaseStatement, List[cst.Attribute]]:
    """The statements touching the optimizer state that ``uses`` (``trainer.optimizer``
    nodes outside ``family``) reach, as :func:`~migrate.optimizer_writes.optimizer_writes`
    finds them in the function (or module) holding each use, with the uses each holds. A
    use in no such statement (``trainer.optimizer.step()``) is in none."""
    facts = family.facts
    found: Dict[cst.BaseStatement, List[cst.Attribute]] = {}
    for use in uses:
        root: cst.CSTNode = facts.enclosing(use, (cst.FunctionDef,)) or facts.module
        statements = optimizer_writes(facts, root, code(use), lambda owner, at: False, set(), set())
        holding = [s for s in statements if facts.within(use, s)]
        if holding:
            found.setdefault(holding[0], []).append(use)
    return found


def getattr_reads(family: "InstanceFamily") -> List[Blocked]:
    """RPM120 for each ``getattr(trainer, name)`` of what may be an instance of ``family``,
    with ``name`` not a string or one of the attributes the class reads through ``self``:
    whether it reads an object the asynchronous step works on is not followed."""
    attributes = {
        a
        for cls in family.classes
        for node in family.facts.subtree(cls, cst.Attribute)
        if (a := _own_attribute(family, node))
    }
    found = []
    for call in family.facts.subtree(family.facts.module, cst.Call):
        if not (isinstance(call.func, cst.Name) and call.func.value == "getattr" and len(call.args) >= 2):
            continue
        name = call.args[1].value
        literal = name.evaluated_value if isinstance(name, cst.SimpleString) else None
        if (literal is None or literal in attributes) and family.may_be_instance(call.args[0].value):
            statement = family.facts.statement_of(call)
            found.append(
                Blocked(
                    call,
                    "RPM120",
                    f"`{code(statement).strip()}` reads an attribute of what may be a {family.name} instance by "
                    "name: whether it is an object the asynchronous step works on is not followed; left untouched",
                )
            )
    return found
