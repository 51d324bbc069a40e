"""Weight reads through the parameter iterator: ``next(model.parameters())``.

A builtin that only takes the parameters out of ``model.parameters()`` (``next``, ``list``,
``iter``, ``tuple``, ``enumerate``), in an expression that reads no ``.grad``, reads the
weights, not the gradients: it measures nothing for the step (it is no ``"measure"``
statement of the step group) and, after an asynchronous step, needs the newest weights
(``model.synchronize()`` before it).
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
import libcst.matchers as m

__all__ = ["takes_weights_out"]

#: builtins that only take the parameters out of the iterator
_ITERATING = ("enumerate", "iter", "list", "next", "tuple")


#: what a parameter tells without its values
_METADATA = frozenset({"device", "dtype", "is_cuda", "shape"})


def takes_weights_out(call: cst.CSTNode, expression: cst.CSTNode, parent: Optional[cst.CSTNode] = None) -> bool:
    """``call`` is ``next(...)``/``list(...)``/... of the parameter iterator, and
    ``expression`` (the value holding it) reads no ``.grad``; with the call's ``parent``
    given, not when that only reads the parameter's metadata (``next(model.parameters()).device``)."""
    iterating = m.Call(func=m.OneOf(*(m.Name(name) for name in _ITERATING)))
    metadata = isinstance(parent, cst.Attribute) and parent.value is call and parent.attr.value in _METADATA
    return m.matches(call, iterating) and not metadata and not m.findall(expression, m.Attribute(attr=m.Name("grad")))
