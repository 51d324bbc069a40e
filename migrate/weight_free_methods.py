"""Methods of the wrapped model's class that provably read none of its weights.

A method of the user's module called on the wrapped model where it is trained
(Tacotron2's ``x, y = model.parse_batch(batch)`` before the forward) is refused as a run of
the model outside RoundPipe (RPM147, :mod:`migrate.method_forward`), unless the method
cannot reach the module at all: then it is a plain function that happens to live on the
class, and :func:`send_weight_free_method` sends the call to the wrapped module
(``model.model.parse_batch(batch)``), which has it. No synchronize goes before it: it reads
no weight. In a statement the migration moves (into a loss function) the call stays as
written: RoundPipe's attribute forwarding reaches the same method.

Proof, from the file's own text: the model is a local name every binding of which in its
scope builds it from one class of the file (``model = Net(...)``) or moves it
(``model = model.to(device)``); that class defines the method itself, undecorated or as a
``staticmethod``/``classmethod``; and the method's body never names its first parameter
(``self``), nor ``super``, ``vars`` or ``locals``. Anything else (an imported class, a
model handed in as a parameter, an instance attribute) is unproven: the call is treated as
one that reads the weights.
"""

from __future__ import annotations

from typing import Optional, Set, Union

import libcst as cst
from libcst.metadata import Assignment

from .names import ModuleFacts
from .plan import Plan
from .syntax import code

__all__ = ["in_rebuilt_statement", "send_weight_free_method"]

#: methods that move a module and return it
_MOVES = frozenset({"to", "cuda", "cpu", "train", "eval", "requires_grad_"})
#: names through which a body may reach its instance without naming it
_INSTANCE_REACHING = frozenset({"super", "vars", "locals"})


def send_weight_free_method(facts: ModuleFacts, plan: Plan, attribute: cst.Attribute, name: str) -> bool:
    """Rewrite the call of ``attribute`` (``name.method``, ``name`` a read of the wrapped
    model) to go to the wrapped module when the method provably reads none of its weights
    (see the module's contract); return whether it did."""
    method = _method(facts, attribute)
    if method is None or not _reads_no_instance(facts, method):
        return False
    if in_rebuilt_statement(facts, plan, attribute):
        return True  # rebuilt from its original text: RoundPipe's attribute forwarding reaches the method
    plan.edits.replace_expression(attribute.value, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model")))
    plan.rewrites.append(
        (
            attribute,
            f"{name}.{attribute.attr.value} -> {name}.model.{attribute.attr.value}: the method of "
            f"`{code(attribute.value)}`'s class reads none of its weights",
        )
    )
    return True


def in_rebuilt_statement(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """``node`` sits in a statement that a block edit of the plan replaces (moved into a
    loss or step function): such statements may be rebuilt from their original text, so an
    expression edit inside them is not sure to reach the output."""
    for block, ranges in plan.edits.blocks.items():
        body = getattr(block, "body", ())
        for start, end, _ in ranges:
            if any(facts.within(node, statement) for statement in body[start:end]):
                return True
    return False


def _method(facts: ModuleFacts, attribute: cst.Attribute) -> Optional[cst.FunctionDef]:
    """The method ``attribute`` names, from the one class of the file that builds its model."""
    model = attribute.value
    scope = facts.scope(model)
    if not isinstance(model, cst.Name) or scope is None:
        return None
    classes: Set[cst.ClassDef] = set()
    for assignment in scope.assignments[model.value]:
        built = _built_class(facts, assignment.node, model.value) if isinstance(assignment, Assignment) else None
        if built is None:
            return None
        if isinstance(built, cst.ClassDef):
            classes.add(built)
    if len(classes) != 1:
        return None
    (klass,) = classes
    found = [s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == attribute.attr.value]
    bound = [
        t
        for s in klass.body.body
        if isinstance(s, cst.SimpleStatementLine)
        for t in facts.subtree(s, cst.Name)
        if t.value == attribute.attr.value
    ]
    return found[0] if len(found) == 1 and not bound else None


def _built_class(facts: ModuleFacts, target: cst.CSTNode, name: str) -> Union[cst.ClassDef, bool, None]:
    """For a binding ``target`` of ``name``: the class of the file it builds
    (``name = Net(...)``), True for a move of ``name`` itself (``name = name.to(d)``), None
    for anything else."""
    assign_target = facts.parent(target)
    assign = facts.parent(assign_target)
    if not (isinstance(assign_target, cst.AssignTarget) and isinstance(assign, cst.Assign)):
        return None
    value = assign.value
    if not isinstance(value, cst.Call):
        return None
    func = value.func
    if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == name:
        return True if func.attr.value in _MOVES else None
    scope = facts.scope(value)
    if not isinstance(func, cst.Name) or scope is None:
        return None
    defined = [getattr(a, "node", None) for a in scope[func.value]]
    if len(defined) == 1 and isinstance(defined[0], cst.ClassDef) and facts.parent(defined[0]) is facts.module:
        return defined[0]
    return None


def _reads_no_instance(facts: ModuleFacts, method: cst.FunctionDef) -> bool:
    """``method``'s body never names its instance (its first parameter, unless it is a
    ``staticmethod``/``classmethod``) nor reaches it through ``super``/``vars``/``locals``."""
    decorators = {code(d.decorator) for d in method.decorators}
    if decorators - {"staticmethod", "classmethod"}:
        return False
    unreachable = set(_INSTANCE_REACHING)
    positional = [*method.params.posonly_params, *method.params.params]
    if not decorators:
        if not positional:
            return False
        unreachable.add(positional[0].name.value)
    return not any(n.value in unreachable for n in facts.subtree(method.body, cst.Name))
