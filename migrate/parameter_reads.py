"""Weight reads through the parameter iterator: ``next(model.parameters())``.

A builtin that only takes the parameters out of ``model.parameters()`` (``next``, ``list``,
``sorted``, ... (:data:`migrate.weight_views.HANDING_BUILTINS`) or ``enumerate``), in an
expression that reads no ``.grad``, reads the weights, not the gradients: it measures
nothing for the step (it is no ``"measure"`` statement of the step group). In the
asynchronous form it is a weight read like any other (:mod:`migrate.synchronize`).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .weight_views import HANDING_BUILTINS

__all__ = ["takes_weights_out"]

#: builtins that only take the parameters out of the iterator (``enumerate`` pairs each with its place)
_ITERATING = HANDING_BUILTINS | {"enumerate"}
_ITERATING_CALL = m.Call(func=m.OneOf(*(m.Name(name) for name in sorted(_ITERATING))))


def takes_weights_out(call: cst.CSTNode, expression: cst.CSTNode) -> bool:
    """``call`` is ``next(...)``/``list(...)``/... of the parameter iterator, and
    ``expression`` (the value holding it) reads no ``.grad``."""
    return m.matches(call, _ITERATING_CALL) and not m.findall(expression, m.Attribute(attr=m.Name("grad")))
