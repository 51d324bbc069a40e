"""The wrapped model used as a container of its layers after the RoundPipe wrap.

``roundpipe.RoundPipe`` forwards attribute reads to the module it wraps, but Python looks
the container protocol up on the type, and a RoundPipe model has none: ``model[0]``,
``model[-1].weight``, ``len(model)``, ``for block in model``, ``list(model)`` and
``layer in model`` of an ``nn.Sequential`` (``ModuleList``, ``ModuleDict``) would fail
after the wrap. :func:`plan_container_use` sends such a use to the wrapped module, which
holds the same layers (``model.model[0]``, ``len(model.model)``), where that keeps what the
program computes:

- outside a step function, always; a use that reaches the layers (all but ``len`` and
  ``in``) reads weights, so the caller synchronizes before it where a step may still run;
- in the function of a migrated step with gradients enabled, only where no layer reached
  this way can run: each layer is read through an attribute (``model[-1].weight``,
  ``model[0].parameters()``; not called, ``model[0](x)``, ``model[0].forward(x)``, nor
  bound or handed on) or only inspected (``isinstance(m, nn.Linear) for m in model``);
  else refused (RPM147), as a method of the model is: the layer would run outside
  RoundPipe, which runs a model only through ``model(...)``;
- in a step function (the statements moved into it, and the functions they call), only
  ``len`` and ``in``: there ``model.parameters()`` is what reaches the optimizer's copies,
  and ``model.model[...]`` holds the model's own weights from before the step (RPM142);
- in a statement moved into a loss function, nothing: it is rebuilt from its original text
  (RPM142).

Weight writes through the wrapped module (``model[2].bias.zero_()``) are still refused by
:mod:`migrate.weight_writes` (RPM141).
"""

from __future__ import annotations

from enum import Enum
from typing import Optional

import libcst as cst

from .method_forward import MODULE_API, trains_here
from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code
from .weight_free_methods import in_rebuilt_statement
from .wrapped_names import runs_in_step

__all__ = ["ContainerUse", "container_use", "plan_container_use"]


class ContainerUse(Enum):
    """How a read of the wrapped model uses it as a container."""

    INDEX = "indexes"  # model[i]
    SIZE = "measures"  # len(model), x in model: no weight is read
    ITERATE = "iterates over"  # for block in model, list(model), [b for b in model]


#: builtins that iterate over what they are given, positionally
_ITERATING_BUILTINS = frozenset(
    {"iter", "list", "tuple", "set", "dict", "reversed", "sorted", "enumerate", "zip", "map", "filter", "any", "all"}
)


def container_use(facts: ModuleFacts, access: cst.BaseExpression) -> Optional[ContainerUse]:
    """How ``access`` (a read of the wrapped model) is used as a container of its layers;
    None when it is not."""
    parent = facts.parent(access)
    if isinstance(parent, cst.Subscript) and parent.value is access:
        return ContainerUse.INDEX
    if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is access:
        return ContainerUse.ITERATE
    if isinstance(parent, cst.ComparisonTarget) and isinstance(parent.operator, (cst.In, cst.NotIn)):
        return ContainerUse.SIZE if parent.comparator is access else None
    call = facts.parent(parent)
    if not (
        isinstance(parent, cst.Arg) and parent.keyword is None and parent.star == "" and isinstance(call, cst.Call)
    ):
        return None
    if not isinstance(call.func, cst.Name) or facts.scope(call) is None:
        return None
    if call.func.value == "len" and len(call.args) == 1:
        return ContainerUse.SIZE
    if call.func.value in _ITERATING_BUILTINS:
        return ContainerUse.ITERATE
    return None


def plan_container_use(facts: ModuleFacts, plan: Plan, access: cst.BaseExpression, name: str) -> Optional[bool]:
    """Send ``access`` (a read of the wrapped model ``name`` after the wrap) to the wrapped
    module when it uses the model as a container (see the module's contract); return
    whether that use reads weights (None: not a container use). Raises :class:`Blocked`
    (RPM142, RPM147) where that would change what the program computes."""
    use = container_use(facts, access)
    if use is None:
        return None
    parent = facts.parent(access)
    assert parent is not None
    where = parent if use is ContainerUse.INDEX else facts.parent(parent) if isinstance(parent, cst.Arg) else access
    assert where is not None
    shown = f"{use.value} {name!r}" if where is access else f"`{code(where)}` {use.value} {name!r}"
    if use is not ContainerUse.SIZE and runs_in_step(facts, plan, access):
        raise Blocked(
            where,
            "RPM142",
            f"{shown} in its step function, where only `{name}.parameters()` reaches the optimizer's copies of "
            f"the weights: the wrapped module's layers ({name}.model) hold the model's own weights from before "
            "the step; reach the layers through parameters(), or migrate by hand",
        )
    if use is not ContainerUse.SIZE and trains_here(facts, plan, access) and _may_run_a_layer(facts, where):
        raise Blocked(
            where,
            "RPM147",
            f"{shown} where it is trained, with gradients enabled: a layer reached this way may run outside "
            f"RoundPipe, which runs a model only through `{name}(...)` (its forward); run the layers in the "
            "model's forward, reach them under torch.no_grad(), or migrate by hand",
        )
    if in_rebuilt_statement(facts, plan, access):
        raise Blocked(
            where,
            "RPM142",
            f"{shown} in a statement the migration moves into the loss or step function, where it cannot go to "
            f"the wrapped module ({name}.model): a RoundPipe model is not a container of its layers; "
            "read the layer into a name before the forward, or migrate by hand",
        )
    plan.edits.replace_expression(access, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model")))
    plan.rewrites.append((where, f"{name} -> {name}.model: {shown} goes to the wrapped module's layers"))
    return use is not ContainerUse.SIZE


#: builtins a layer may be handed to without being run
_INSPECTING_BUILTINS = frozenset({"isinstance", "type", "id", "str", "repr", "print", "len", "hasattr"})


def _may_run_a_layer(facts: ModuleFacts, where: cst.CSTNode) -> bool:
    """A layer reached at ``where`` (a subscript of the model, the model iterated by a loop
    or comprehension, or a builtin iterating it) may be run: it is used other than by
    :func:`_only_inspected` (a builtin's result, a bound or iterated layer, always)."""
    if isinstance(where, cst.Subscript):
        return not _only_inspected(facts, where)
    loop = facts.parent(where)
    if not isinstance(loop, (cst.For, cst.CompFor)) or not isinstance(loop.target, cst.Name):
        return True
    variable = loop.target.value
    body: Optional[cst.CSTNode] = loop.body if isinstance(loop, cst.For) else facts.parent(loop)
    assert body is not None
    uses = [n for n in facts.subtree(body, cst.Name) if n.value == variable and n is not loop.target]
    return not all(_only_inspected(facts, use) for use in uses)


def _only_inspected(facts: ModuleFacts, layer: cst.CSTNode) -> bool:
    """``layer`` is read through an attribute that is not called as a method of its own
    (``model[-1].weight``, ``model[0].parameters()``, not ``model[0].forward(x)``), or handed
    to a builtin that only inspects it (``isinstance(layer, nn.Linear)``)."""
    parent = facts.parent(layer)
    if isinstance(parent, cst.Attribute) and parent.value is layer:
        call = facts.parent(parent)
        called = isinstance(call, cst.Call) and call.func is parent
        return not called or (parent.attr.value in MODULE_API and parent.attr.value != "forward")
    call = facts.parent(parent)
    return (
        isinstance(parent, cst.Arg)
        and isinstance(call, cst.Call)
        and isinstance(call.func, cst.Name)
        and call.func.value in _INSPECTING_BUILTINS
    )
