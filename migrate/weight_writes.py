"""The wrapped model's weights written in place on the main thread after the wrap.

``roundpipe.RoundPipe`` keeps the optimizer's copies of the weights; once the optimizer is
built on them, a main-thread write into the model's own parameters changes the model but not
the copies, and the next step writes the copies back over it (RPM141). A write is a use of
an expression holding the model's weights (the model, ``model.head.bias``,
``model.get_submodule("fc").weight``, ``next(model.parameters())``, a name bound to one, the
variable of a loop over ``model.parameters()``: see :mod:`migrate.weight_views`):

- an in-place method (a name ending in ``_``, ``requires_grad_`` aside), ``reset_parameters()``
  or ``apply(...)``;
- an assignment or augmented assignment to an attribute or subscript of it (``.data = ...``),
  or an augmented assignment to the loop variable itself (``p *= 0.5``);
- the expression handed to a ``torch.nn.init`` function, as the first argument of an in-place
  ``torch`` function (``torch._foreach_mul_``) or of one reparametrizing a module
  (``torch.nn.utils.parametrize``, ``prune``, ``weight_norm``, ``spectral_norm``), or as the
  parameters of ``torch.nn.utils.vector_to_parameters``;
- a cast of its floating-point type (``.half()``, ``.float()``, ``.double()``,
  ``.bfloat16()``, ``.type(...)``, ``.to(...)`` given a ``torch`` dtype or ``dtype=``): the
  copies keep their type, so the model would train in another precision than the original.
  A module's cast returns the module itself; so a cast whose result is used as a tensor
  (``model.emb.weight.double().sum()``: a tensor method no module has, or arithmetic) was
  a tensor's, which makes a new tensor: a read. The model itself is always taken for a module.

``load_state_dict`` is not such a write: RoundPipe refreshes the copies after it. Statements
moved into a step function run on the copies' side and are not looked at.

A subscript of the wrapped model itself (``model[2]``) that is not sent to the wrapped
module (:mod:`migrate.wrapped_containers`) is refused (RPM142): a RoundPipe model is not a
container of its layers.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code
from .weight_views import weight_holders

__all__ = ["check_weight_write"]

_INIT = "torch.nn.init."
_REPARAMETRIZING = (
    "torch.nn.utils.parametrize.",
    "torch.nn.utils.prune.",
    "torch.nn.utils.parametrizations.",
    "torch.nn.utils.weight_norm",
    "torch.nn.utils.spectral_norm",
)
_VECTOR_TO_PARAMETERS = "torch.nn.utils.vector_to_parameters"
_WRITING_METHODS = {"apply", "reset_parameters"}
_NOT_WRITES = {"requires_grad_"}
_CASTS = {"half", "float", "double", "bfloat16", "type"}
#: tensor attributes and methods that ``nn.Module`` has not: used on a cast's result, they
#: show the cast was a tensor's
_TENSOR_ONLY = frozenset(
    "item tolist numpy sum mean norm abs max min amax amin std var prod numel dim size shape dtype clone "
    "allclose equal any all isfinite isnan square sqrt pow".split()
)
_DTYPES = {"float16", "half", "float32", "float", "float64", "double", "bfloat16", "complex64", "complex128"}


def check_weight_write(facts: ModuleFacts, plan: Plan, access: cst.BaseExpression, name: str) -> None:
    """Raise :class:`Blocked` (RPM141) when ``access`` (a read of the wrapped model ``name``
    after the wrap) reaches an in-place write of its weights, or (RPM142) when it is
    subscripted and not sent to the wrapped module."""
    if _in_step(facts, plan, access):
        return
    parent = facts.parent(access)
    if isinstance(parent, cst.Subscript) and parent.value is access and access not in plan.edits.expressions:
        raise Blocked(
            parent,
            "RPM142",
            f"`{code(parent)}` indexes {name!r}, which is a RoundPipe model after the wrap, not a "
            f"container of its layers; index the wrapped module ({name}.model[...]) or migrate by hand",
        )
    for holder in weight_holders(facts, access):
        if holder.expression is not access and _in_step(facts, plan, holder.expression):
            continue
        tensor = holder.tensor or (holder.expression is not access and _cast_used_as_tensor(facts, holder.expression))
        write = _write_at(facts, holder.expression, holder.is_root, tensor)
        if write is not None:
            _refuse(facts, write, holder.loop, name)


def _in_step(facts: ModuleFacts, plan: Plan, node: cst.CSTNode) -> bool:
    """``node`` is in a statement moved into a step function (run on the copies' side)."""
    return any(facts.within(node, statement) for statement in plan.step_statements)


def _write_at(facts: ModuleFacts, held: cst.BaseExpression, is_root: bool, tensor: bool) -> Optional[cst.CSTNode]:
    """The node that writes the weights ``held`` holds by its nearest use, else None; a name
    holding them by itself (``is_root``) is not written by binding it again, nor tensors
    (``tensor``) by a cast, which makes new ones."""
    parent = facts.parent(held)
    call = facts.parent(parent)
    if isinstance(parent, cst.Attribute) and isinstance(call, cst.Call) and call.func is parent:
        method = parent.attr.value
        if method in _WRITING_METHODS or (method.endswith("_") and method not in _NOT_WRITES):
            return call
        if not tensor and (method in _CASTS or (method == "to" and _casts_dtype(call))):
            return call
    if isinstance(parent, cst.Arg) and parent.value is held and isinstance(call, cst.Call):
        if _writes_argument(facts, call, parent):
            return call
    if isinstance(parent, cst.AugAssign) and parent.target is held:
        return parent
    if not is_root and isinstance(parent, cst.AssignTarget) and parent.target is held:
        return parent
    return None


def _cast_used_as_tensor(facts: ModuleFacts, held: cst.BaseExpression) -> bool:
    """``held.double()`` (any method call on ``held``) whose result is used as only a tensor
    can be: a tensor method no ``nn.Module`` has (``.sum()``, ``.item()``) or an operand of
    arithmetic. A module's cast returns the module, so ``held`` holds a tensor."""
    method = facts.parent(held)
    call = facts.parent(method)
    if not (isinstance(method, cst.Attribute) and isinstance(call, cst.Call) and call.func is method):
        return False
    use = facts.parent(call)
    if isinstance(use, cst.Attribute) and use.value is call:
        return use.attr.value in _TENSOR_ONLY
    if isinstance(use, cst.BinaryOperation):
        return True
    return isinstance(use, cst.UnaryOperation) and not isinstance(use.operator, cst.Not)


def _writes_argument(facts: ModuleFacts, call: cst.Call, arg: cst.Arg) -> bool:
    """``call`` writes what its argument ``arg`` holds (see the module's contract)."""
    if facts.calls_prefix(call, [_INIT]):
        return True
    names = facts.qualified(call.func)
    if call.args[0] is arg and any(_writes_first_argument(qualified) for qualified in names):
        return True
    if _VECTOR_TO_PARAMETERS in names:
        keyword = arg.keyword.value if arg.keyword is not None else None
        return keyword == "parameters" or (keyword is None and call.args.index(arg) == 1)
    return False


def _writes_first_argument(qualified: str) -> bool:
    """``torch.clamp_``, ``torch._foreach_add_``, ``torch.nn.utils.prune.l1_unstructured``:
    a ``torch`` function writing (or reparametrizing) its first argument; the gradient
    clipping functions write gradients, not weights."""
    last = qualified.rpartition(".")[2]
    in_place = qualified.startswith("torch.") and last.endswith("_") and not last.startswith("clip_grad")
    return in_place or qualified.startswith(_REPARAMETRIZING)


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


def _refuse(facts: ModuleFacts, write: cst.CSTNode, loop: Optional[cst.For], name: str) -> None:
    """Report ``write`` at the loop it was reached through (if any), naming the write."""
    where = loop if loop is not None else write
    statement = facts.statement_of(where)
    if isinstance(statement, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
        statement = statement.with_changes(leading_lines=())  # its first line of code, not a comment above it
    shown = code(statement).strip().splitlines()[0]
    written = "" if loop is None else f" (`{code(write).strip().splitlines()[0]}`)"
    raise Blocked(
        where,
        "RPM141",
        f"`{shown}` writes the weights of {name!r}{written} after the RoundPipe wrap, when the optimizer "
        "already holds its own copies of them: the next step would write the copies back over it; do it "
        "before the optimizer is built, or migrate by hand",
    )
