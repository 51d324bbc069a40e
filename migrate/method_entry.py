"""Methods of a trainer class that a caller may run while the instance's last step still runs.

A training method (``fit``, whose loop calls ``self.model.step(...)`` in the asynchronous
form) returns with its last step still running. A caller that then runs another method of
the instance (``tr.fit(batches); tr.report()``) reaches that method's reads of
``self.model`` while the step may run, so for those reads the method's start counts as right
after training. It does not for ``__init__`` (no step of the instance ran yet), for a method
that trains itself, or for one that a training method of the file calls through ``self``
(its reads are part of that training loop: one step stale, as the default form is).
"""

from __future__ import annotations

from typing import Dict, List, Set

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts
from .synchronize import Synchronizations

__all__ = ["MethodEntries"]


class MethodEntries:
    """Which methods of one module start right after training (the training methods are
    found once per model)."""

    def __init__(self, facts: ModuleFacts, syncs: Synchronizations) -> None:
        self.facts = facts
        self.syncs = syncs
        self._training: Dict[str, Set[str]] = {}  # model -> names of the methods that train it

    def after_training(self, read: cst.CSTNode, model: str) -> bool:
        """The read ``read`` of the instance's model ``model`` (``self.model``) is in a
        method of a class (not in a function nested in one) that a caller may run right
        after a training method of the instance returned (see the module's docstring)."""
        function = self.facts.enclosing(read, (cst.FunctionDef,))
        if function is None or not model.startswith("self.") or function.name.value == "__init__":
            return False
        block = self.facts.parent(function)
        if not (isinstance(block, cst.IndentedBlock) and isinstance(self.facts.parent(block), cst.ClassDef)):
            return False
        if model not in self._training:
            self._training[model] = self._training_methods(model)
        return function.name.value not in self._training[model]

    def _training_methods(self, model: str) -> Set[str]:
        """The names of the module's methods that train ``model`` and of those they call
        through ``self`` (followed until nothing new is found)."""
        methods = [
            statement
            for cls in self.facts.subtree(self.facts.module, cst.ClassDef)
            for statement in cls.body.body
            if isinstance(statement, cst.FunctionDef)
        ]
        training: Set[str] = set()
        pending: List[cst.FunctionDef] = [method for method in methods if self.syncs.trains(method.body, model)]
        while pending:
            method = pending.pop()
            if method.name.value in training:
                continue
            training.add(method.name.value)
            called = {
                call.func.attr.value
                for call in self.facts.subtree(method, cst.Call)
                if isinstance(call.func, cst.Attribute) and m.matches(call.func.value, m.Name("self"))
            }
            pending.extend(other for other in methods if other.name.value in called)
        return training
