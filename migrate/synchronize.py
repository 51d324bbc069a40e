"""``model.synchronize()`` before the main-thread statements that need the newest weights.

Evaluation, saving or loading state, and main-thread writes of optimizer state must not run
while an asynchronous step is still running: each gets ``<model>.synchronize()`` on the line
before it. :class:`Synchronizations` inserts them for one module, once for a stretch of a
block with no training in between (a second state read after the first needs none), and
not when the line before already synchronizes that model.
"""

from __future__ import annotations

from typing import List, Set, Tuple

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts
from .plan import Plan
from .syntax import dotted, method_call, only_expression

__all__ = ["Synchronizations"]


class Synchronizations:
    """The ``synchronize()`` lines planned for one module (into ``plan``)."""

    def __init__(self, facts: ModuleFacts, plan: Plan) -> None:
        self.facts = facts
        self.plan = plan
        self._synced: Set[Tuple[int, int, str]] = set()  # (block, index, model) already given a sync

    def before(self, node: cst.CSTNode, model: str, why: str) -> bool:
        """Plan ``<model>.synchronize()`` before the statement holding ``node`` (``why``: the
        report's reason, after the call). False when that statement is not a statement of a
        block (nothing planned)."""
        statement = self.facts.statement_of(node)
        block = self.facts.parent(statement)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return False
        body = list(block.body)
        index = body.index(statement)
        earlier = [i for b, i, name in self._synced if b == id(block) and i <= index and name == model]
        if earlier and not any(self.may_train(s, model) for s in body[max(earlier) : index]):
            return True  # already synchronized in this block, and no training since
        previous = only_expression(body[index - 1]) if index > 0 else None
        if previous is not None and method_call(previous, model, "synchronize"):
            return True
        self._synced.add((id(block), index, model))
        self.plan.edits.insert_before(block, index, [cst.parse_statement(f"{model}.synchronize()\n")])
        self.plan.rewrites.append((statement, f"{model}.synchronize() {why}"))
        return True

    def after_training(
        self, node: cst.CSTNode, model: str, why: str, since: int = 0, entered_trained: bool = False
    ) -> bool:
        """Plan ``<model>.synchronize()`` before the use ``node`` of the model's weights or
        outputs when a statement before it in its function (or module), past source rank
        ``since`` (where ``model`` holds the wrapped model), may train ``model``, or, with
        ``entered_trained``, when the function may start right after training (a method its
        caller runs after a training method: :mod:`migrate.method_entry`); its last
        asynchronous step may still run then: before the use's statement, or before the
        outermost loop holding it below that training (not once per evaluation step);
        nothing when the use is inside a loop that trains (one step stale there, and never
        torn: the model's weights are written on the main thread only). True when planned."""
        child = target = self.facts.statement_of(node)
        outer: List[cst.CSTNode] = []
        for ancestor in self.facts.ancestors(child):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                break
            outer.append(ancestor)
        if any(isinstance(a, (cst.For, cst.While)) and self.trains(a.body, model) for a in outer):
            return False
        for ancestor in outer:
            if isinstance(ancestor, (cst.IndentedBlock, cst.Module)):
                body = list(ancestor.body)
                index = next((i for i, statement in enumerate(body) if statement is child), 0)
                earlier = [s for s in body[:index] if self.facts.order(s) > since]
                if any(self.may_train(statement, model) for statement in earlier):
                    return self.before(target, model, why)
            if isinstance(ancestor, cst.BaseStatement):
                child = ancestor
            if isinstance(ancestor, (cst.For, cst.While)):
                target = ancestor
        return self.before(target, model, why) if entered_trained else False

    def trains(self, statement: cst.CSTNode, model: str, depth: int = 0) -> bool:
        """The statement may run a training step of ``model``: it calls a ``backward`` or a
        ``step``, hands ``model`` to a call, calls a function of this module that may
        (``optimizer_step(optimizer, scaler)``; followed three calls deep), or calls a method
        named like one of the module's that does (``trainer.train_step(batch, optimizer)``)."""
        for call in self.facts.subtree(statement, cst.Call):
            if self._steps(call):
                return True
            if any(dotted(arg.value) == model for arg in call.args):
                return True
            if isinstance(call.func, cst.Attribute) and self._a_method_named_steps(call.func.attr.value):
                return True
            function = self.facts.local_function(call)
            if function is not None and (depth >= 3 or self.trains(function.body, model, depth + 1)):
                return True
        return False

    def may_train(self, statement: cst.CSTNode, model: str) -> bool:
        """:meth:`trains`, or, for an instance's model used from outside its class
        (``trainer.model``), the statement calls any method of that instance
        (``trainer.fit(loader)`` may reach the step): what a wait must come after."""
        if self.trains(statement, model):
            return True
        return any(
            isinstance(call.func, cst.Attribute) and self._holder_method(call.func, model)
            for call in self.facts.subtree(statement, cst.Call)
        )

    def _holder_method(self, func: cst.Attribute, model: str) -> bool:
        """``func`` is a method of the instance holding ``model`` (``trainer.fit`` for
        ``trainer.model``), called from outside the instance's class (not through a
        method's own instance parameter)."""
        holder, _, attribute = model.rpartition(".")
        if not (attribute and holder.isidentifier() and dotted(func.value) == holder):
            return False
        method = self.facts.enclosing(func, (cst.FunctionDef,))
        params = [*method.params.posonly_params, *method.params.params] if method is not None else []
        in_class = method is not None and isinstance(self.facts.parent(self.facts.parent(method)), cst.ClassDef)
        return not (in_class and params and params[0].name.value == holder)

    @staticmethod
    def _steps(call: cst.Call) -> bool:
        return m.matches(call.func, m.Attribute(attr=m.Name("backward") | m.Name("step")))

    def _a_method_named_steps(self, name: str) -> bool:
        """A method ``name`` of a class of this module calls a ``backward`` or a ``step``
        itself (``trainer.train_step(batch, optimizer)`` may run the training step)."""
        return any(
            isinstance(method, cst.FunctionDef)
            and method.name.value == name
            and any(self._steps(call) for call in self.facts.subtree(method, cst.Call))
            for cls in self.facts.subtree(self.facts.module, cst.ClassDef)
            for method in cls.body.body
        )
