"""The wrapped model's weights written in place on the main thread after the wrap.

``roundpipe.RoundPipe`` keeps the optimizer's copies of the weights; once the optimizer is
built on them, a main-thread write into the model's own parameters (``nn.init.zeros_(model.
head.bias)``, ``for p in model.parameters(): p.mul_(0.5)``) changes the model but not the
copies, and the next step writes the copies back over it (RPM141). ``load_state_dict`` is
not such a write: RoundPipe refreshes the copies after it. Statements moved into a step
function run on the copies' side and are not looked at.
"""

from __future__ import annotations

import libcst as cst

from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code

__all__ = ["check_weight_write"]

_INIT = "torch.nn.init."


def check_weight_write(facts: ModuleFacts, plan: Plan, access: cst.BaseExpression, name: str) -> None:
    """Raise :class:`Blocked` (RPM141) when ``access`` (a read of the wrapped model ``name``
    after the wrap) is the start of an in-place write of its weights."""
    if any(facts.within(access, statement) for statement in plan.step_statements):
        return
    expression: cst.CSTNode = access
    while isinstance(facts.parent(expression), cst.Attribute):
        expression = facts.parent(expression)  # type: ignore[assignment]
    parent = facts.parent(expression)
    call = facts.parent(parent) if isinstance(parent, cst.Arg) else None
    if isinstance(call, cst.Call) and facts.calls_prefix(call, [_INIT]):
        _refuse(facts, call, name)
    loop = facts.parent(parent) if isinstance(parent, cst.Call) and parent.func is expression else None
    if (
        isinstance(expression, cst.Attribute)
        and expression.attr.value in ("parameters", "named_parameters")
        and isinstance(loop, cst.For)
        and loop.iter is parent
    ):
        target = loop.target.elements[-1].value if isinstance(loop.target, cst.Tuple) else loop.target
        if isinstance(target, cst.Name) and _writes_in_place(facts, loop.body, target.value):
            _refuse(facts, loop, name)


def _writes_in_place(facts: ModuleFacts, body: cst.CSTNode, parameter: str) -> bool:
    """``p.mul_(...)``, ``p.data.copy_(...)`` or ``p.data = ...`` under ``body``."""
    for call in facts.subtree(body, cst.Call):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value.endswith("_") and func.attr.value != "requires_grad_":
            receiver = func.value
            if isinstance(receiver, cst.Attribute) and receiver.attr.value == "data":
                receiver = receiver.value
            if isinstance(receiver, cst.Name) and receiver.value == parameter:
                return True
    for target in facts.subtree(body, cst.AssignTarget):
        written = target.target
        if isinstance(written, cst.Attribute) and written.attr.value == "data":
            if isinstance(written.value, cst.Name) and written.value.value == parameter:
                return True
    return False


def _refuse(facts: ModuleFacts, node: cst.CSTNode, name: str) -> None:
    raise Blocked(
        node,
        "RPM141",
        f"`{code(facts.statement_of(node)).strip().splitlines()[0]}` writes the weights of {name!r} after "
        "the RoundPipe wrap, when the optimizer already holds its own copies of them: the next step would "
        "write the copies back over it; do it before the optimizer is built, or migrate by hand",
    )
