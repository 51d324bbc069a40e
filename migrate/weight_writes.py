"""The wrapped model's weights written in place on the main thread after the wrap.

``roundpipe.RoundPipe`` keeps the optimizer's copies of the weights; once the optimizer is
built on them, a main-thread write into the model's own parameters changes the model but not
the copies, and the next step writes the copies back over it (RPM141). A write is, on a chain
of attributes rooted at the wrapped model (``model.head.bias``) or at the variable of a loop
over its ``parameters()``/``named_parameters()``/``modules()``/``named_modules()``/
``children()``/``named_children()``:

- an in-place method (a name ending in ``_``, ``requires_grad_`` aside), ``reset_parameters()``
  or ``apply(...)``;
- an assignment or augmented assignment to an attribute or subscript of it (``.data = ...``),
  or an augmented assignment to the loop variable itself (``p *= 0.5``);
- the chain handed to a ``torch.nn.init`` function;
- a cast of its floating-point type (``.half()``, ``.float()``, ``.double()``,
  ``.bfloat16()``, ``.type(...)``, ``.to(...)`` given a ``torch`` dtype or ``dtype=``): the
  copies keep their type, so the model would train in another precision than the original.

``load_state_dict`` is not such a write: RoundPipe refreshes the copies after it. Statements
moved into a step function run on the copies' side and are not looked at.

A subscript of the wrapped model itself (``model[2]``) is refused (RPM142): a RoundPipe
model is not a container of its layers.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code

__all__ = ["check_weight_write"]

_INIT = "torch.nn.init."
_LOOPED = {"parameters", "named_parameters", "modules", "named_modules", "children", "named_children"}
_WRITING_METHODS = {"apply", "reset_parameters"}
_NOT_WRITES = {"requires_grad_"}
_CASTS = {"half", "float", "double", "bfloat16", "type"}
_DTYPES = {"float16", "half", "float32", "float", "float64", "double", "bfloat16", "complex64", "complex128"}


def check_weight_write(facts: ModuleFacts, plan: Plan, access: cst.BaseExpression, name: str) -> None:
    """Raise :class:`Blocked` (RPM141) when ``access`` (a read of the wrapped model ``name``
    after the wrap) is the start of an in-place write of its weights, or (RPM142) when it is
    subscripted."""
    if any(facts.within(access, statement) for statement in plan.step_statements):
        return
    parent = facts.parent(access)
    if isinstance(parent, cst.Subscript) and parent.value is access:
        raise Blocked(
            parent,
            "RPM142",
            f"`{code(parent)}` indexes {name!r}, which is a RoundPipe model after the wrap, not a "
            f"container of its layers; index the wrapped module ({name}.model[...]) or migrate by hand",
        )
    top = _chain_top(facts, access)
    write = _write_at(facts, top, is_root=top is access)
    if write is not None:
        _refuse(facts, write, name)
    loop = _loop_over(facts, top)
    if loop is not None:
        target = loop.target.elements[-1].value if isinstance(loop.target, cst.Tuple) else loop.target
        if isinstance(target, cst.Name):
            for use in facts.subtree(loop.body, cst.Name):
                if use.value != target.value or _is_attribute_name(facts, use):
                    continue
                chained = _chain_top(facts, use)
                if _write_at(facts, chained, is_root=chained is use) is not None or _augmented(facts, chained):
                    _refuse(facts, loop, name)


def _chain_top(facts: ModuleFacts, root: cst.BaseExpression) -> cst.BaseExpression:
    """The outermost attribute or subscript read of ``root`` (``model.head.weight.data``)."""
    expression = root
    while True:
        parent = facts.parent(expression)
        if isinstance(parent, cst.Attribute) and parent.value is expression:
            expression = parent
        elif isinstance(parent, cst.Subscript) and parent.value is expression:
            expression = parent
        else:
            return expression


def _write_at(facts: ModuleFacts, top: cst.BaseExpression, is_root: bool) -> Optional[cst.CSTNode]:
    """The node that writes through the chain ending at ``top``, else None; a bare root
    (``is_root``: the model or loop variable itself) is written by a ``torch.nn.init`` call,
    not by binding its name again."""
    parent = facts.parent(top)
    if isinstance(parent, cst.Call) and parent.func is top and isinstance(top, cst.Attribute):
        method = top.attr.value
        if method in _WRITING_METHODS or (method.endswith("_") and method not in _NOT_WRITES):
            return parent
        if method in _CASTS or (method == "to" and _casts_dtype(parent)):
            return parent
    call = facts.parent(parent) if isinstance(parent, cst.Arg) and parent.value is top else None
    if isinstance(call, cst.Call) and facts.calls_prefix(call, [_INIT]):
        return call
    if is_root:
        return None
    if isinstance(parent, cst.AssignTarget) and parent.target is top:
        return parent
    if isinstance(parent, cst.AugAssign) and parent.target is top:
        return parent
    return None


def _casts_dtype(call: cst.Call) -> bool:
    """``.to(torch.float64)``, ``.to(device, torch.half)``, ``.to(dtype=...)``: a ``to`` call
    that changes the floating-point type (a device alone does not)."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == "dtype":
            return True
        value = arg.value
        if arg.keyword is None and isinstance(value, cst.Attribute) and value.attr.value in _DTYPES:
            return isinstance(value.value, cst.Name) and value.value.value == "torch"
    return False


def _augmented(facts: ModuleFacts, top: cst.BaseExpression) -> bool:
    """``p *= 0.5``: an in-place operator on the parameter itself."""
    parent = facts.parent(top)
    return isinstance(parent, cst.AugAssign) and parent.target is top


def _loop_over(facts: ModuleFacts, top: cst.BaseExpression) -> Optional[cst.For]:
    """The ``for`` loop whose iterable is ``top()`` when ``top`` is one of :data:`_LOOPED`."""
    parent = facts.parent(top)
    if not (isinstance(top, cst.Attribute) and top.attr.value in _LOOPED):
        return None
    if not (isinstance(parent, cst.Call) and parent.func is top):
        return None
    loop = facts.parent(parent)
    return loop if isinstance(loop, cst.For) and loop.iter is parent else None


def _is_attribute_name(facts: ModuleFacts, name: cst.Name) -> bool:
    """``x.p``: the attribute's name, not the variable ``p``."""
    parent = facts.parent(name)
    return isinstance(parent, cst.Attribute) and parent.attr is name


def _refuse(facts: ModuleFacts, node: cst.CSTNode, name: str) -> None:
    statement = facts.statement_of(node)
    if isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        statement = statement.with_changes(leading_lines=())  # its first line of code, not a comment above it
    raise Blocked(
        node,
        "RPM141",
        f"`{code(statement).strip().splitlines()[0]}` writes the weights of {name!r} after "
        "the RoundPipe wrap, when the optimizer already holds its own copies of them: the next step would "
        "write the copies back over it; do it before the optimizer is built, or migrate by hand",
    )
