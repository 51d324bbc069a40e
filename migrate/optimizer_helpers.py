"""Optimizers built by a helper of the project from parameter groups (issue 10, shape 8).

``create_optimizer(model, lr=..., weight_decay=...)`` groups the module's parameters by name
(decay / no-decay, layer-wise learning rates, ``named_parameters()`` filters) and builds the
optimizer itself, so ``model.parameters()`` cannot be rewritten to the optimizer copies. The
helper is given the wrapped module instead (``model.model``: the same names, the same
parameter objects) and the optimizer it returns is moved onto the copies by identity at run
time, every group option kept::

    model = roundpipe.RoundPipe(model, ...)
    optimizer = model.adopt_optimizer(create_optimizer(model.model, lr=..., weight_decay=...))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .attribute_aliases import local_aliases
from .attributes import InstanceFamily
from .multi_step import several_models_message
from .optimizer_factories import factory_blocker
from .origins import parameters_fed
from .plan import Binding, Blocked
from .syntax import code, only_assignment

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["grouped_before", "helper_model", "plan_adopting_wrap"]


#: how many assignments back the names an optimizer call is given are followed
_GROUPING_DEPTH = 3

_GROUPED = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters") | m.Name("named_parameters")))


def helper_model(step: "StepBuilder", built: Binding) -> Optional[Tuple[str, str]]:
    """(the model's name where the optimizer is built, its name in the step's scope) when
    exactly one model the step calls in its forward is what the optimizer call groups:
    passed to it as a plain name (``create_optimizer(model, cfg)``), grouped inside it
    (``AdamW([{"params": [p for n, p in model.named_parameters() if ...]}])``), or grouped
    by an earlier statement of the same scope whose result it is given
    (``groups = param_groups(model, wd)``; ``AdamW(groups, ...)``); else None."""
    call = built.value
    if not isinstance(call, cst.Call):
        return None
    followed = _followed_groups(step, built, call)
    names = [name for name, _ in _grouped_names(call)] + [g for _, value in followed for g, _ in _grouped_names(value)]
    if isinstance(built.scope, InstanceFamily):  # `self.opt = create_optimizer(args, self.model)`
        names += _attributes_passed(step, call)
    found = [(name, local) for name in dict.fromkeys(names) for local in _step_names(step, built, name)]
    if len(found) != 1:
        return None
    blocker = factory_blocker(step.facts, call)  # `build_optimizer(cfg, model)` also steps, wraps...
    if blocker is not None:
        raise Blocked(call, "RPM108", f"{blocker}; left untouched")
    name, _ = found[0]
    _refuse_other_parameters(step, built, name, followed)
    return name, step.local_name_for(name, built)


def grouped_before(step: "StepBuilder", built: Binding) -> Set[str]:
    """The modules whose ``parameters()`` / ``named_parameters()`` the names given to the
    optimizer call hold, through the earlier assignments of its scope (``groups = [{"params":
    [p for n, p in model.named_parameters() ...]}]``; ``AdamW(groups + [...])``)."""
    call = built.value
    if not isinstance(call, cst.Call):
        return set()
    values = [value for _, value in _followed_groups(step, built, call)]
    return {grouped.func.value.value for value in values for grouped in m.findall(value, _GROUPED)}  # type: ignore[attr-defined]


def _grouped_names(node: cst.BaseExpression) -> List[Tuple[str, cst.Name]]:
    """Names a call passes as plain arguments, directly or to a call among its arguments
    (``AdamW(get_params_groups(model))``), or groups with ``x.parameters()`` /
    ``x.named_parameters()`` inside it."""
    found: List[Tuple[str, cst.Name]] = []
    if isinstance(node, cst.Call):
        for call in (node, *(a.value for a in node.args if isinstance(a.value, cst.Call))):
            found += [(a.value.value, a.value) for a in call.args if not a.star and isinstance(a.value, cst.Name)]
    for grouped in m.findall(node, _GROUPED):
        receiver = grouped.func.value  # type: ignore[attr-defined]
        found.append((receiver.value, receiver))
    return found


def _attributes_passed(step: "StepBuilder", call: cst.Call) -> List[str]:
    """The instance attributes (``self.model``) ``call`` passes as plain arguments."""
    passed = [step.rules.attributes.reference(a.value) for a in call.args if not a.star]
    return [reference for reference in passed if reference is not None and "." in reference]


def _followed_groups(step: "StepBuilder", built: Binding, call: cst.Call) -> List[Tuple[cst.Name, cst.BaseExpression]]:
    """The names among ``call``'s arguments with the values the earlier assignments of the
    same scope bound them to, and the names those values read in turn (OpenCLIP: ``named =
    list(model.named_parameters())``; ``decay = [p for n, p in named if ...]``;
    ``AdamW([{"params": decay, ...}, ...])``)."""
    followed: List[Tuple[cst.Name, cst.BaseExpression]] = []
    seen: Set[str] = set()
    pending = [name for arg in call.args for name in _read_names(step, arg.value)]
    for _ in range(_GROUPING_DEPTH):
        found = []
        for name in pending:
            earlier = None if name.value in seen else _earlier_value(step, built, name)
            seen.add(name.value)
            if earlier is not None:
                found.append((name, earlier))
        followed += found
        pending = [name for _, value in found for name in _read_names(step, value)]
    return followed


def _refuse_other_parameters(
    step: "StepBuilder", built: Binding, model: str, followed: List[Tuple[cst.Name, cst.BaseExpression]]
) -> None:
    """Raise :class:`Blocked` (RPM108) when the optimizer call, or what it is given, may hold
    parameters that are not ``model``'s: a group on another module's ``parameters()``
    (``{"params": criterion.parameters()}``), or a followed name used by a statement before
    the call (``groups.append(...)``), which may add any. ``adopt_optimizer`` takes only the
    wrapped module's parameters (it raises at run time on any other)."""
    facts = step.facts
    call = built.value
    assert isinstance(call, cst.Call)
    inside = [call, *(value for _, value in followed)]
    owners = {grouped.func.value.value for node in inside for grouped in m.findall(node, _GROUPED)}  # type: ignore[attr-defined]
    for name in _carriers(step, followed):
        scope = facts.scope(name)
        reads = facts.accesses(name.value, scope) if scope is not None else []
        for read in reads:
            if facts.order(read) > facts.order(call) or any(facts.within(read, node) for node in inside):
                continue
            statement = facts.statement_of(read)
            if _binds(statement, built.name):
                continue  # the same optimizer built on them in another branch: `else: optimizer = SGD(groups)`
            others = {grouped.func.value.value for grouped in m.findall(statement, _GROUPED)}  # type: ignore[attr-defined]
            if not others - {model}:
                raise Blocked(
                    statement,
                    "RPM108",
                    f"{name.value!r} is changed by line {facts.line(statement)} before the optimizer "
                    f"{built.name!r} is built on it: the parameters it holds there are not followed "
                    f"(RoundPipe's optimizer copies take only the parameters of {model!r}); left untouched",
                )
            owners |= others
    if owners - {model}:
        raise Blocked(call, "RPM108", several_models_message(built.name, owners | {model}))


def _binds(statement: cst.BaseStatement, name: str) -> bool:
    """``statement`` is a plain assignment of ``name`` (``optimizer = SGD(groups, ...)``)."""
    small = only_assignment(statement)
    return small is not None and any(code(target.target) == name for target in small.targets)


def _carriers(step: "StepBuilder", followed: List[Tuple[cst.Name, cst.BaseExpression]]) -> List[cst.Name]:
    """The followed names that hold parameters: bound to a value grouping some module's
    (``named = list(model.named_parameters())``) or reading such a name (``decay = [p for
    n, p in named ...]``); not the others (``args = parser.parse_args()`` for ``lr=args.lr``)."""
    carrying: Set[str] = set()
    for _ in range(_GROUPING_DEPTH + 1):
        carrying |= {
            name.value
            for name, value in followed
            if m.findall(value, _GROUPED) or carrying & {read.value for read in _read_names(step, value)}
        }
    return [name for name, _ in followed if name.value in carrying]


def _read_names(step: "StepBuilder", node: cst.CSTNode) -> List[cst.Name]:
    """The names ``node`` reads (not the attribute names of ``x.attr``)."""
    facts = step.facts
    return [
        name
        for name in facts.subtree(node, cst.Name)
        if not (isinstance(parent := facts.parent(name), cst.Attribute) and parent.attr is name)
    ]


def _earlier_value(step: "StepBuilder", built: Binding, name: cst.Name) -> Optional[cst.BaseExpression]:
    """The value a plain name passed to the optimizer call was bound to by one earlier
    assignment of the same scope (``groups = ...``), else None."""
    facts = step.facts
    scope = facts.scope(name)
    assignments = [a for a in scope[name.value] if isinstance(a, Assignment)] if scope is not None else []
    if len(assignments) != 1 or scope is not built.scope:
        return None
    node = assignments[0].node
    if not isinstance(node, cst.CSTNode) or facts.order(node) >= facts.order(built.value):
        return None
    line = facts.statement_of(node)
    small = only_assignment(line)
    if small is None or len(small.targets) != 1:
        return None
    return small.value


def _step_names(step: "StepBuilder", built: Binding, name: str) -> List[str]:
    """The names under which the step's function sees ``name`` of the helper's scope and
    calls it (at most one)."""
    facts = step.facts
    step_scope = facts.scope(step.backward)
    function = facts.enclosing(step.backward, (cst.FunctionDef,))
    root = function or facts.module
    if isinstance(built.scope, InstanceFamily):  # `self.model`, or `model = self.model` in the step's method
        spelled = [name, *local_aliases(step.rules, step.backward, name)]
        return [name] if any(step.model_calls(root, spelling) for spelling in spelled) else []
    if step_scope is built.scope:
        candidates = [name]
    elif isinstance(function, cst.FunctionDef):
        candidates = list(parameters_fed(step.rules, function, name, built.scope))
    else:
        candidates = []
    return [c for c in candidates if step.model_calls(root, c)][:1]


def plan_adopting_wrap(step: "StepBuilder", built: Binding, model: str) -> None:
    """Wrap ``model`` before the statement that builds the optimizer, give the helper the
    wrapped module and move its optimizer onto the copies (``model.adopt_optimizer``)."""
    plan = step.rules.plan

    def adopt(updated: cst.BaseExpression) -> cst.BaseExpression:
        assert isinstance(updated, cst.Call)
        grouped = _handing_the_module(updated, model, into_arguments=True).visit(_OnTheModule(model))
        return cst.Call(
            func=cst.Attribute(value=cst.parse_expression(model), attr=cst.Name("adopt_optimizer")),
            args=[cst.Arg(grouped)],  # type: ignore[arg-type]
        )

    assert built.value is not None
    plan.edits.replace_expression(built.value, adopt)
    step.plan_wrap(built, model)
    plan.rewrites.append(
        (
            built.value,
            f"optimizer built by a helper on {model}.model (its own parameter names), "
            f"moved onto the optimizer copies with {model}.adopt_optimizer()",
        )
    )


def _handing_the_module(call: cst.Call, model: str, into_arguments: bool) -> cst.Call:
    """``call`` passing ``model.model`` where it passes ``model`` as a plain argument, and
    (``into_arguments``) so do the calls among its arguments (``AdamW(groups(model))``)."""
    args = []
    for arg in call.args:
        if not arg.star and m.matches(arg.value, m.Name() | m.Attribute(value=m.Name())) and code(arg.value) == model:
            arg = arg.with_changes(value=cst.Attribute(value=arg.value, attr=cst.Name("model")))
        elif into_arguments and isinstance(arg.value, cst.Call):
            arg = arg.with_changes(value=_handing_the_module(arg.value, model, into_arguments=False))
        args.append(arg)
    return call.with_changes(args=args)


class _OnTheModule(cst.CSTTransformer):
    """``model.parameters()`` / ``model.named_parameters()`` inside the optimizer call group
    the wrapped module (``model.model``): its own names, not the wrapper's."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.model = model

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        if m.matches(updated, _GROUPED) and code(updated.func.value) == self.model:  # type: ignore[attr-defined]
            module = cst.Attribute(value=cst.parse_expression(self.model), attr=cst.Name("model"))
            func = updated.func.with_changes(value=module)
            return updated.with_changes(func=func)
        return updated
