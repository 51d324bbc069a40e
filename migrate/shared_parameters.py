"""A function whose parameter gets the wrapped model at one call and another object at
another (``evaluate(model)`` during training, ``evaluate(restored)`` or
``evaluate(model_ema)`` later).

What the migration writes inside such a function for the RoundPipe model (``model.synchronize()``,
``model.model.state_dict()``, ``model.step(...)``) would fail on the other objects, so a file
where a changed function is also called with something other than the wrapped model is left
untouched (RPM139). Only same-file calls are seen: the callers the model is followed through.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Set, Tuple

import libcst as cst

from .edits import Edits
from .names import ModuleFacts
from .plan import Blocked
from .syntax import code

__all__ = ["ParameterFeeds"]

ParameterOf = Callable[[cst.Call, cst.FunctionDef, cst.Arg], str]


class ParameterFeeds:
    """The same-file functions the wrapped model is handed to, and which arguments hand it."""

    def __init__(self, facts: ModuleFacts, parameter_of: ParameterOf) -> None:
        self.facts = facts
        self._parameter_of = parameter_of  # the parameter a call's argument binds (Blocked: unknown)
        self._fed: List[Tuple[cst.FunctionDef, str, Set[int]]] = []  # function, parameter, ids of the args

    def record(self, arg: cst.Arg, parameter: str) -> None:
        """``arg`` hands the wrapped model to ``parameter`` of the function its call calls."""
        function = self.facts.local_function(self.facts.parent(arg))
        if function is None:
            return
        for known, name, args in self._fed:
            if known is function and name == parameter:
                args.add(id(arg))
                return
        self._fed.append((function, parameter, {id(arg)}))

    def check(self, edits: Edits) -> None:
        """Raise :class:`Blocked` (RPM139) at a call that gives a changed function's model
        parameter something the model was not followed into (or leaves it to its default)."""
        for function, parameter, args in self._fed:
            if not self._changed(function, edits):
                continue
            scope = self.facts.scope(function)
            if scope is None:
                continue
            for use in self.facts.accesses(function.name.value, scope):
                call = self.facts.parent(use)
                if not isinstance(call, cst.Call) or call.func is not use:
                    raise Blocked(
                        use,
                        "RPM139",
                        f"{function.name.value}() is changed for the RoundPipe model it gets as "
                        f"{parameter!r}, and is also handed on here as a value; its other callers "
                        "could give it another object; left untouched",
                    )
                given = self._argument(call, function, parameter)
                if given is None or id(given) not in args:
                    what = f"`{code(given.value)}`" if given is not None else "its default"
                    raise Blocked(
                        call,
                        "RPM139",
                        f"{function.name.value}() gets the RoundPipe model as {parameter!r} elsewhere, "
                        f"and {what} here; what the migration writes into it for the model "
                        "(synchronize, model.model, model.step) would fail on that object; left untouched",
                    )

    def _changed(self, function: cst.FunctionDef, edits: Edits) -> bool:
        return any(self.facts.within(node, function) for node in [*edits.expressions, *edits.blocks])

    def _argument(self, call: cst.Call, function: cst.FunctionDef, parameter: str) -> Optional[cst.Arg]:
        for arg in call.args:
            try:
                if self._parameter_of(call, function, arg) == parameter:
                    return arg
            except Blocked:
                return arg  # `*args`: not followed, so not one of the recorded arguments
        return None
