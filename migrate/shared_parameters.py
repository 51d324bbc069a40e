"""A function whose parameter gets the wrapped model at one call and another object at
another (``evaluate(model)`` during training, ``evaluate(restored)`` or
``evaluate(model_ema)`` later).

What the migration writes inside such a function for the RoundPipe model (``model.synchronize()``,
``model.model.state_dict()``, ``model.step(...)``) would fail on the other objects, so a file
where a changed function is also called with something other than the wrapped model is left
untouched (RPM139). Only same-file calls are seen: the callers the model is followed through;
a method counts every ``x.<its name>(...)`` of the file as a call of it.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Set, Tuple

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

    def record(self, arg: cst.Arg, function: cst.FunctionDef, parameter: str) -> None:
        """``arg`` hands the wrapped model to ``parameter`` of ``function`` (a function of the
        file, or a method called as ``self.method(...)``)."""
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
            for use in self._uses(function):
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

    def fed_arguments(self, function: cst.FunctionDef, parameter: str) -> Optional[List[cst.Arg]]:
        """The arguments handing the wrapped model to ``parameter`` of ``function`` when every
        use of the function is a call and some call gives that parameter something else
        (or leaves it to its default), else None."""
        args = next((ids for known, name, ids in self._fed if known is function and name == parameter), set())
        fed: List[cst.Arg] = []
        others = False
        for use in self._uses(function):
            call = self.facts.parent(use)
            if not isinstance(call, cst.Call) or call.func is not use:
                return None
            given = self._argument(call, function, parameter)
            if given is not None and id(given) in args:
                fed.append(given)
            else:
                others = True
        return fed if fed and others else None

    def _uses(self, function: cst.FunctionDef) -> Sequence[cst.BaseExpression]:
        """Every reference to ``function``: its name's reads, or for a method, every
        ``<anything>.<its name>`` of the file."""
        name = function.name.value
        if isinstance(self.facts.parent(self.facts.parent(function)), cst.ClassDef):
            return [a for a in self.facts.subtree(self.facts.module, cst.Attribute) if a.attr.value == name]
        scope = self.facts.scope(function)
        return self.facts.accesses(name, scope) if scope is not None else []

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
