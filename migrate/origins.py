"""Where an object a training step uses was built: every binding that reaches a name.

A name bound in its own scope has one origin, that binding. A function parameter has the
origins of what each same-file call site passes: a name is followed further, a call
expression written in the argument (``train(model, create_optimizer(model, cfg))``) is an
origin itself. So a training function called for two models (each with its own optimizer)
has two origins for its optimizer parameter, and each is wrapped where it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, List, Optional, Tuple

import libcst as cst
from libcst.metadata import Assignment, Scope

from .attribute_aliases import aliased_attribute
from .attributes import InstanceFamily
from .inherited_init import handed_arguments
from .method_calls import method_call_sites
from .names import argument_for
from .plan import Binding, Blocked
from .syntax import exclusive, only_assignment

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .torch_amp import TorchAmpRules

__all__ = ["origins", "constructor_parameter", "parameters_fed", "INLINE"]

#: the name of an origin that is a call written in an argument: it binds no name
INLINE = ""

_MAX_DEPTH = 4


def origins(rules: "TorchAmpRules", name: str, at: cst.CSTNode, depth: int = 0) -> List[Binding]:
    """The bindings that can reach ``name`` at ``at``, each once, in call-site order.

    Raises :class:`Blocked` (RPM108) when a parameter cannot be followed: its function is not
    called in this file, too deep, or a call site passes something else than a name or a
    call expression on a line of its own statement."""
    facts = rules.facts
    binding = rules.binding(name, at)
    attribute = aliased_attribute(rules, binding)  # `optimizer = self.optimizer` in a method
    if attribute is not None and depth <= _MAX_DEPTH:
        return origins(rules, attribute, binding.statement or at, depth + 1)
    handed = constructor_parameter(facts, binding)  # `self.model = model` in __init__
    if handed is not None and depth <= _MAX_DEPTH:
        return _through_constructions(rules, binding, *handed, depth)
    if binding.statement is not None:
        return _exclusive_branches(rules, binding, at) or [binding]
    function = facts.function_of(binding.scope)
    if function is None or depth > _MAX_DEPTH:
        raise Blocked(at, "RPM108", f"cannot follow {name!r} to where it is built")
    method_sites = method_call_sites(rules, function)  # `self.train_step(batch, self.optimizer)`
    sites = facts.call_sites(function) if method_sites is None else method_sites
    if not sites:
        raise Blocked(
            function,
            "RPM108",
            f"{function.name.value}() is not called in this file; its model/optimizer cannot be followed",
        )
    skipped = 0 if method_sites is None else 1
    passed = [(site, argument_for(site, function, name, skipped)) for site in sites]
    return _passed(rules, name, passed, depth)


def constructor_parameter(facts: "ModuleFacts", binding: Binding) -> Optional[Tuple[cst.FunctionDef, str]]:
    """(``__init__``, the parameter) when ``binding`` (an instance attribute's) is
    ``self.x = param`` in ``__init__`` with ``param`` one of its parameters; else None."""
    value, statement = binding.value, binding.statement
    if not isinstance(binding.scope, InstanceFamily) or not isinstance(value, cst.Name) or statement is None:
        return None
    method = binding.scope.method_of(statement)
    scope = facts.scope(value)
    assignments = list(scope[value.value]) if scope is not None else []
    if method is None or method.name.value != "__init__" or len(assignments) != 1:
        return None
    param = getattr(assignments[0], "node", None)
    if not isinstance(param, cst.Param) or param not in method.params.params:
        return None
    return method, value.value


def _through_constructions(
    rules: "TorchAmpRules", binding: Binding, init: cst.FunctionDef, param: str, depth: int
) -> List[Binding]:
    """The origins of an attribute bound from ``init``'s ``param``: what every
    construction of the class (or of a subclass handing it on) passes for it
    (:mod:`migrate.handed_in`, :mod:`migrate.inherited_init`)."""
    return _passed(rules, param, handed_arguments(rules.facts, binding.scope, init, param), depth)  # type: ignore[arg-type]


def _passed(
    rules: "TorchAmpRules", name: str, passed: List[Tuple[cst.Call, Optional[cst.BaseExpression]]], depth: int
) -> List[Binding]:
    """The origins of the values call sites pass for the parameter ``name``, each once."""
    facts = rules.facts
    found: List[Binding] = []
    for site, value in passed:
        held = rules.state_objects.reference(value)  # `train(state.model, state.optimizer)`
        attribute = rules.attributes.reference(value) if isinstance(value, cst.Attribute) else None
        if isinstance(value, cst.Name):
            reached = origins(rules, value.value, site, depth + 1)
        elif attribute is not None:  # `self.train_step(batch, self.optimizer)`
            reached = origins(rules, attribute, site, depth + 1)
        elif held is not None:
            reached = [rules.binding(held, site)]
        elif isinstance(value, cst.Call) and isinstance(facts.statement_of(site), cst.SimpleStatementLine):
            reached = [Binding(facts.scope(site), INLINE, facts.statement_of(site), value)]
        else:
            raise Blocked(site, "RPM108", f"{name!r} is not passed as a plain name or a call")
        for origin in reached:
            if not any(origin.statement is f.statement and origin.value is f.value for f in found):
                found.append(origin)
    return found


def _exclusive_branches(rules: "TorchAmpRules", binding: Binding, at: cst.CSTNode) -> List[Binding]:
    """``if adam: optimizer = Adam(...) else: optimizer = SGD(...)``: the bindings of the name
    before ``at`` when there are several and each pair sits in different branches of one
    ``if`` (only one of them runs), each as an origin; else none."""
    facts = rules.facts
    scope = binding.scope
    if not isinstance(scope, Scope):  # an instance attribute: one binding (attributes.py)
        return []
    nodes = [a.node for a in scope[binding.name] if isinstance(a, Assignment) and facts.order(a.node) < facts.order(at)]
    if len(nodes) < 2 or any(isinstance(n, cst.Param) for n in nodes):
        return []
    statements = [facts.statement_of(n) for n in nodes]
    if not all(exclusive(facts, first, second) for i, first in enumerate(statements) for second in statements[i + 1 :]):
        return []
    found = []
    for statement in statements:
        small = only_assignment(statement)
        if small is None or len(small.targets) != 1:
            return []
        found.append(Binding(scope, binding.name, statement, small.value))
    return found


def parameters_fed(rules: "TorchAmpRules", function: cst.FunctionDef, name: str, scope: object) -> Iterator[str]:
    """The parameters of ``function`` through which its callers pass what ``name`` of
    ``scope`` (another scope) holds, in parameter order (lazily: a caller that needs the
    first one follows no further parameter)."""
    for param in function.params.params:
        try:
            reached = origins(rules, param.name.value, function.body.body[0])
        except Blocked:
            continue
        if any(o.name == name and o.scope is scope for o in reached):
            yield param.name.value
