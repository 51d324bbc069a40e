"""The expressions that hold the wrapped model's weights, reached from one read of it.

A write of the weights after the optimizer is built (RPM141, :mod:`migrate.weight_writes`)
rarely goes through the model's name alone: real code reaches a parameter through a method
(``model.get_submodule("fc").weight``, ``model.fc.get_parameter("weight")``), a builtin
(``next(model.parameters())``, ``list(model.parameters())[0]``), a name bound to one
(``w = model.fc.weight``), or a loop (``for p in model.parameters()``, a comprehension, a
loop over ``zip``/``enumerate``/``filter`` of them). :func:`weight_holders` follows all of
these from a read of the model and yields every expression whose value is the model, one of
its modules or parameters, a view of one, or a container of them; what is done to each is
for the caller to judge.

Each holder comes with ``is_root``: True for a name that holds weights by itself (the model
read, a loop variable, an alias), where binding the name again is not a write; and with
``tensor``: True when it is known to hold tensors, not modules (reached through
``parameters()``, ``state_dict()``, ``.data``, a tensor view), where a cast (``.float()``)
makes a new tensor instead of changing the weights.
"""

from __future__ import annotations

from typing import Iterator, List, NamedTuple, Optional, Set, Union

import libcst as cst

from .names import ModuleFacts

__all__ = ["HANDING_BUILTINS", "Holder", "weight_holders"]

# Methods whose result holds the weights of what they are called on: modules and parameters
# reached by name, iterators over them, the state dict (its tensors share the parameters'
# storage), a dict's views of it, and tensor views.
_HANDING_METHODS = {
    "parameters",
    "named_parameters",
    "modules",
    "named_modules",
    "children",
    "named_children",
    "buffers",
    "named_buffers",
    "get_submodule",
    "get_parameter",
    "get_buffer",
    "state_dict",
    "values",
    "items",
    "detach",
    "view",
    "view_as",
    "reshape",
    "flatten",
    "t",
    "narrow",
    "select",
    "squeeze",
    "unsqueeze",
    "permute",
    "transpose",
    "expand",
    "unbind",
    "chunk",
    "split",
    "to",
    "cpu",
    "cuda",
}
# The handing methods whose result holds modules (or what it held before); the others hold tensors.
_MODULE_METHODS = {
    "modules",
    "named_modules",
    "children",
    "named_children",
    "get_submodule",
    "values",
    "items",
    "to",
    "cpu",
    "cuda",
}
#: Builtins whose result holds the very objects they are given (every argument), not a
#: measure of them: ``next(model.parameters())`` is a parameter. (``getattr`` holds its
#: first argument's attribute, and ``zip``/``enumerate`` put what they are given at one
#: place of a tuple: each is followed on its own.)
HANDING_BUILTINS = frozenset({"next", "iter", "list", "tuple", "dict", "filter", "reversed", "sorted"})
_Loop = Union[cst.For, cst.CompFor]
_COMPREHENSIONS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


class Holder(NamedTuple):
    """An expression holding the model's weights; ``is_root``: a name holding them by
    itself; ``loop``: the outermost ``for`` statement it was reached through, if any;
    ``tensor``: it holds tensors, not modules."""

    expression: cst.BaseExpression
    is_root: bool
    loop: Optional[cst.For] = None
    tensor: bool = False


# Attributes of a module or parameter that hold no weights: setting ``requires_grad``
# (freezing a GAN's discriminator), the gradient, or the training flag writes nothing the
# optimizer's copies hold.
_NOT_WEIGHTS = frozenset({"requires_grad", "grad", "training"})


def weight_holders(facts: ModuleFacts, read: cst.BaseExpression) -> Iterator[Holder]:
    """Every expression holding the weights reached from ``read`` (a read of the wrapped
    model: a name, ``self.model``), ``read`` first; each is followed once."""
    pending: List[Holder] = [Holder(read, True)]
    seen: Set[int] = set()
    while pending:
        holder = pending.pop()
        if id(holder.expression) in seen:
            continue
        seen.add(id(holder.expression))
        yield holder
        for reached in _next_holders(facts, holder.expression, element=None):
            pending.append(reached._replace(loop=holder.loop or reached.loop, tensor=holder.tensor or reached.tensor))


def _next_holders(facts: ModuleFacts, held: cst.BaseExpression, element: Optional[int]) -> Iterator[Holder]:
    """The holders one use away from ``held``; ``element``: the place of the weights in the
    tuples ``held`` yields (from ``zip``/``enumerate``), None when it yields them bare."""
    parent = facts.parent(held)
    if isinstance(parent, cst.Attribute) and parent.value is held:
        call = facts.parent(parent)
        if isinstance(call, cst.Call) and call.func is parent:
            if parent.attr.value in _HANDING_METHODS:
                yield Holder(call, False, tensor=parent.attr.value not in _MODULE_METHODS)
        elif parent.attr.value not in _NOT_WEIGHTS:
            yield Holder(parent, False, tensor=parent.attr.value == "data")
    elif isinstance(parent, cst.Subscript) and parent.value is held:
        yield Holder(parent, False)
    elif isinstance(parent, cst.Arg) and parent.value is held:
        yield from _through_builtin(facts, parent)
    elif isinstance(parent, cst.Assign) and parent.value is held:
        for target in parent.targets:
            if isinstance(target.target, cst.Name):
                yield from _alias_reads(facts, target.target, after=parent)
    elif isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is held:
        yield from _loop_reads(facts, parent, element)


def _through_builtin(facts: ModuleFacts, arg: cst.Arg) -> Iterator[Holder]:
    """``next(held)``, ``filter(f, held)``, ``getattr(held, name)``: the call holds the
    weights; ``zip(a, held)`` and ``enumerate(held)`` hold them at one place of each tuple,
    followed straight into the loop over the call."""
    call = facts.parent(arg)
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name) or arg.keyword is not None:
        return
    place = call.args.index(arg)
    builtin = call.func.value
    if builtin in HANDING_BUILTINS or (builtin == "getattr" and place == 0):
        yield Holder(call, False)
        return
    element = place if builtin == "zip" else 1 if builtin == "enumerate" else None
    loop = facts.parent(call)
    if element is not None and isinstance(loop, (cst.For, cst.CompFor)) and loop.iter is call:
        yield from _loop_reads(facts, loop, element)


def _alias_reads(facts: ModuleFacts, alias: cst.Name, after: cst.CSTNode) -> Iterator[Holder]:
    """The reads of ``alias`` (bound to a holder by ``after``) that come later."""
    scope = facts.scope(alias)
    if scope is None:
        return
    for read in facts.accesses(alias.value, scope):
        if facts.order(read) > facts.order(after):
            yield Holder(read, True)


def _loop_reads(facts: ModuleFacts, loop: _Loop, element: Optional[int]) -> Iterator[Holder]:
    """The reads of the loop variable holding the weights, in the loop's body (a ``for``)
    or in its comprehension; ``element`` picks it from a tuple target, else the last name of
    one (``for name, p in model.named_parameters()``) or the whole target."""
    target: cst.BaseExpression = loop.target
    if isinstance(target, (cst.Tuple, cst.List)) and target.elements:
        picked = element if element is not None and element < len(target.elements) else -1
        target = target.elements[picked].value
    if not isinstance(target, cst.Name):
        return
    where: Optional[cst.CSTNode] = loop.body if isinstance(loop, cst.For) else facts.enclosing(loop, _COMPREHENSIONS)
    if where is None:
        return
    for use in facts.subtree(where, cst.Name):
        parent = facts.parent(use)
        if use.value != target.value or (isinstance(parent, cst.Attribute) and parent.attr is use):
            continue
        if use is not target:
            yield Holder(use, True, loop if isinstance(loop, cst.For) else None)
