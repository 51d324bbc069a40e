"""A step split over two functions of the module that are handed the scaler.

Training scripts keep the backward and the optimizer work in helpers of their own::

    def backward_step(loss, grad_scaler):
        grad_scaler.scale(loss).backward()

    def optimizer_step(optimizer, grad_scaler, model, max_norm=None):
        ...  # unscale_ + clipping, grad_scaler.step(optimizer), grad_scaler.update(), zero_grad

and the loop calls them in turn with the scaler, model and optimizer it built (in a project,
the helpers are often in another file: :mod:`migrate.joined_classes` then analyses the files
as one module). Such a step takes the autograd form (design/MIGRATE.md, "Two target
forms"), as a step split over methods does (:mod:`migrate.split_step`): the backward stays as
written, only the optimizer function's step group becomes ``model.step(_step_fn)`` +
``grad_scaler.update()``.

What makes it certain: the backward ends a top-level function whose scaler is a parameter;
exactly one other top-level function steps a parameter of the same name (or, when none
does, one steps a parameter of another name used as a scaler, ``grad_scaler.step(optimizer)``
and ``grad_scaler.update()`` beside ``backward_step(loss, amp_scaler)``), in one recognised
step group; both functions are only ever called by name (never handed around as values), and
every call of either passes the very same scaler binding; the model the step function trains
is, in the optimizer function, a parameter fed with that model at every call; and no
``zero_grad`` runs anywhere in the module outside the group (it could empty the gradients
between backward and step). In the asynchronous form, neither the callers nor the optimizer
function outside its step group may touch the optimizer's state (a learning-rate loop would
race with the optimizer thread).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Tuple

import libcst as cst

from .aliases import spellings
from .names import argument_for
from .optimizer_writes import optimizer_writes
from .plan import Binding, Blocked
from .split_step import refuse_zero_grad_outside
from .syntax import code, method_call

if TYPE_CHECKING:
    from .recognised import RecognisedStep
    from .steps import StepBuilder, StepGroup

__all__ = ["detached_function_group", "plan_detached_function"]

_CODE = "RPM106"
#: Methods only a scaler has, of those a step helper calls.
_SCALER_OWN = ("update", "unscale_", "scale", "get_scale")


def detached_function_group(step: "StepBuilder") -> Optional["StepGroup"]:
    """The step group of the one other top-level function that steps a parameter named like
    the backward's scaler parameter (or, when none does, one named otherwise: the builder
    then follows the scaler under that name), when the backward ends its function; else None.

    Raises :class:`Blocked` (RPM106) when such a function exists but the two cannot be shown
    to be handed the same scaler."""
    backward_function = _top_level_function(step, step.backward)
    if backward_function is None or not step.ends_function(backward_function):
        return None
    if not _is_parameter(backward_function, step.scaler):
        return None
    stepping = _stepping(step, backward_function, step.scaler)
    if not stepping:  # a scaler named otherwise: the one handed the same scaler, if several
        others = _stepping(step, backward_function, None)
        stepping = others if len(others) == 1 else [f for f in others if _same_scaler(step, backward_function, *f)]
    if len(stepping) != 1:
        return None
    function, call, scaler = stepping[0]
    if not isinstance(function.body, cst.IndentedBlock):
        return None
    named = step.scaler, step.scaler_spellings
    if scaler != step.scaler:  # `backward_step(loss, amp_scaler)`, `optimizer_step(opt, grad_scaler, model)`
        step.scaler, step.scaler_spellings = scaler, spellings(step.facts, scaler, function.body.body[0])
    found, _ = step.step_group_after(function.body, list(function.body.body), -1)
    if found is None or not any(step.facts.within(call, s) for s in found.statements):
        step.scaler, step.scaler_spellings = named
        return None
    _require_same_scaler(step, backward_function, named[0], function, scaler)
    step.step_site = found.statements[0]
    return found


def _stepping(
    step: "StepBuilder", backward_function: cst.FunctionDef, scaler: Optional[str]
) -> List[Tuple[cst.FunctionDef, cst.Call, str]]:
    """(function, its ``p.step(optimizer)`` call, ``p``) for the other top-level functions
    stepping a parameter ``p`` named ``scaler`` (None: any parameter that the function
    also calls a scaler's own method on, ``update``, ``unscale_``, ``scale``, ``get_scale``)."""
    found = []
    for function in _top_level_functions(step):
        calls = step.facts.subtree(function, cst.Call) if function is not backward_function else []
        for param in function.params.params:
            name = param.name.value
            if scaler not in (None, name):
                continue
            if scaler is None and not any(method_call(c, name, own) for c in calls for own in _SCALER_OWN):
                continue
            found += [(function, call, name) for call in calls if method_call(call, name, "step")]
    return found


def plan_detached_function(step: "StepBuilder", recognised: "RecognisedStep") -> bool:
    """Plan ``recognised`` as the autograd form of a step split over two top-level functions
    (True); False when its group is in the backward's own function or not in a top-level
    one. Raises :class:`Blocked` (RPM106) for what would make the split step unsound."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    function = _top_level_function(step, found.block)
    backward_function = _top_level_function(step, step.backward)
    if function is None or backward_function is None or function is backward_function:
        return False
    where = f"{function.name.value}()"
    if not _is_parameter(function, model):
        raise Blocked(
            found.statements[0],
            _CODE,
            f"the step in {where} trains {model!r}, which is not a parameter of {where}; "
            "a step split over functions is migrated only when the model is handed in",
        )
    _require_same_caller_binding(step, function, model, step.rules.constructed(model, found.statements[0]))
    outside = f"{where}, which holds the optimizer step of a step split over functions"
    refuse_zero_grad_outside(step, found, [step.facts.module], outside)
    if not step.rules.exact:
        _refuse_optimizer_writes(step, function, backward_function, found, optimizer)
    unfused = Blocked(step.backward, _CODE, f"the optimizer step is in another function ({where})")
    step.plan_autograd_form(recognised, unfused)
    return True


def _top_level_functions(step: "StepBuilder") -> List[cst.FunctionDef]:
    return [s for s in step.facts.module.body if isinstance(s, cst.FunctionDef)]


def _top_level_function(step: "StepBuilder", node: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The top-level function holding ``node`` directly (not in a nested function or class)."""
    function = step.facts.enclosing(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))
    return (
        function if isinstance(function, cst.FunctionDef) and step.facts.parent(function) is step.facts.module else None
    )


def _is_parameter(function: cst.FunctionDef, name: str) -> bool:
    return name in {p.name.value for p in function.params.params}


def _same_scaler(
    step: "StepBuilder", backward_function: cst.FunctionDef, function: cst.FunctionDef, _: cst.Call, name: str
) -> bool:
    """Every call of ``function`` hands it, as ``name``, the scaler the backward's function
    is handed (a parameter of another name stepped: the same scaler, or another object)."""
    try:
        _require_same_scaler(step, backward_function, step.scaler, function, name)
    except Blocked:
        return False
    return True


def _require_same_scaler(
    step: "StepBuilder", first: cst.FunctionDef, first_name: str, second: cst.FunctionDef, name: str
) -> None:
    """Both functions are called by name only, and every call passes the same scaler (as
    ``first_name`` of ``first``, ``name`` of ``second``)."""
    scaler = step.rules.constructed(first_name, first.body.body[0])
    _require_same_caller_binding(step, second, name, scaler)
    for function in (first, second):
        scope = step.facts.scope(function)
        accesses = step.facts.accesses(function.name.value, scope) if scope is not None else []
        for access in accesses:
            parent = step.facts.parent(access)
            if not (isinstance(parent, cst.Call) and parent.func is access):
                raise Blocked(
                    access,
                    _CODE,
                    f"{function.name.value}() holds part of a step split over functions but is used as a "
                    "value here, so its callers cannot all be seen; migrate it by hand",
                )


def _require_same_caller_binding(step: "StepBuilder", function: cst.FunctionDef, name: str, expected: Binding) -> None:
    scope = step.facts.scope(function.body.body[0])
    found = step.rules.caller_binding(Binding(scope, name, None, None), function)
    if found.statement is not expected.statement:
        raise Blocked(
            function,
            _CODE,
            f"{function.name.value}() is not handed the same {name!r} as the rest of the step split "
            "over functions; migrate it by hand",
        )


def _refuse_optimizer_writes(
    step: "StepBuilder",
    function: cst.FunctionDef,
    backward_function: cst.FunctionDef,
    found: "StepGroup",
    optimizer: str,
) -> None:
    """In the asynchronous form, a write of the optimizer's state by a caller or by the
    optimizer function outside its step group (a learning-rate loop, a scheduler step) would
    race with the optimizer thread: refused."""
    trainers = {function.name.value, backward_function.name.value}
    places: List[Tuple[cst.CSTNode, str]] = [(function, optimizer)]
    for site in step.facts.call_sites(function):
        passed = argument_for(site, function, optimizer)
        if isinstance(passed, cst.Name):
            places.append((step.facts.enclosing(site, (cst.FunctionDef,)) or step.facts.module, passed.value))
    for root, name in places:
        writes = optimizer_writes(step.facts, root, name, step.is_scheduler, set(found.statements), trainers)
        if writes:
            raise Blocked(
                writes[0],
                _CODE,
                f"`{code(writes[0])}` touches optimizer state that {function.name.value}() steps on the "
                "optimizer thread (a step split over functions); use --exact or migrate it by hand",
            )
