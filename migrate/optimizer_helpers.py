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

from typing import TYPE_CHECKING, List, Optional, Tuple

import libcst as cst

from .origins import origins
from .plan import Binding, Blocked

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["helper_model", "plan_adopting_wrap"]


def helper_model(step: "StepBuilder", built: Binding) -> Optional[Tuple[str, str]]:
    """(the model's name where the helper is called, its name in the step's scope) when
    exactly one plain-name argument of the helper call ``built.value`` is the model the
    step calls in its forward; else None."""
    call = built.value
    if not isinstance(call, cst.Call):
        return None
    names = [a.value.value for a in call.args if not a.star and isinstance(a.value, cst.Name)]
    found = [(name, local) for name in dict.fromkeys(names) for local in _step_names(step, built, name)]
    if len(found) != 1:
        return None
    name, _ = found[0]
    return name, step._local_name_for(name, built)


def _step_names(step: "StepBuilder", built: Binding, name: str) -> List[str]:
    """The names under which the step's function sees ``name`` of the helper's scope and
    calls it (at most one)."""
    facts = step.facts
    step_scope = facts.scope(step.backward)
    function = facts.enclosing(step.backward, (cst.FunctionDef,))
    root = function or facts.module
    if step_scope is built.scope:
        candidates = [name]
    elif isinstance(function, cst.FunctionDef):
        candidates = []
        for param in function.params.params:
            try:
                reached = origins(step.rules, param.name.value, function.body.body[0])
            except Blocked:
                continue
            if any(o.name == name and o.scope is built.scope for o in reached):
                candidates.append(param.name.value)
    else:
        candidates = []
    return [c for c in candidates if step._model_calls(root, c)][:1]


def plan_adopting_wrap(step: "StepBuilder", built: Binding, model: str) -> None:
    """Wrap ``model`` before the statement that builds the optimizer, give the helper the
    wrapped module and move its optimizer onto the copies (``model.adopt_optimizer``)."""
    plan = step.rules.plan

    def adopt(updated: cst.BaseExpression) -> cst.BaseExpression:
        assert isinstance(updated, cst.Call)
        args = [
            a.with_changes(value=cst.Attribute(value=a.value, attr=cst.Name("model")))
            if not a.star and isinstance(a.value, cst.Name) and a.value.value == model
            else a
            for a in updated.args
        ]
        return cst.Call(
            func=cst.Attribute(value=cst.Name(model), attr=cst.Name("adopt_optimizer")),
            args=[cst.Arg(updated.with_changes(args=args))],
        )

    assert built.value is not None
    plan.edits.replace_expression(built.value, adopt)
    step._plan_wrap(built, model, [])
    plan.rewrites.append(
        (
            built.value,
            f"optimizer built by a helper on {model}.model (its own parameter names), "
            f"moved onto the optimizer copies with {model}.adopt_optimizer()",
        )
    )
