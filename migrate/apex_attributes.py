"""``amp.initialize`` results held on ``self``: one simple class.

The shape (a trainer class building its model and optimizer in a method)::

    class Learner:
        def __init__(self):
            self.model = ...
            self.optimizer = torch.optim.SGD(self.model.parameters(), ...)
            self.model, self.optimizer = amp.initialize(self.model, self.optimizer, ...)

        def fit_batch(self, x, y): ...          # the step, on self.model / self.optimizer
        def checkpoint(self): ... self.model.state_dict() ... self.optimizer.state_dict()
        def restore(self, state): ... load_state_dict(...)

:class:`HeldOnSelf` checks that ``initialize`` rebinds the same two attributes of the
method's own ``self`` (or one, for a model-only call), directly in a method of a class, from
those attributes or from locals that the method does not mention after the call (the
attributes then hold the only live references). In the step, a local alias of the model
(``model = self.model``) is refused (RPM201, :func:`held_alias`).
After the steps are planned, :meth:`HeldOnSelf.plan_other_uses` walks every ``.model`` /
``.optimizer`` attribute of the module (by the attribute names): those of the class's own
``self`` outside the steps may only read or load state dicts or switch train/eval mode; they
get ``self.model.synchronize()`` before them (:mod:`migrate.synchronize`: the newest
weights, no running step), and the
model's state dicts go through the wrapped module (``self.model.model.state_dict()``) so the
keys stay the module's. Anything else (an attribute of another object, a nested function,
a subclass, another use) refuses the file (RPM201) naming the statement: following the
objects further is the general attribute-following of the torch path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Set

import libcst as cst
import libcst.matchers as m

from .attributes import InstanceAttributes
from .names import ModuleFacts
from .plan import Blocked, Plan
from .synchronize import Synchronizations
from .syntax import code

__all__ = ["HeldOnSelf", "held_alias"]

_MODEL_STATE = ("state_dict", "load_state_dict")
_MODES = ("train", "eval")
_WHY_SYNC = "before reading or loading state"


@dataclass
class HeldOnSelf:
    """The class whose instances hold ``initialize``'s model (and optimizer) attributes."""

    attributes: InstanceAttributes  # the module's (instance parameters of methods)
    owner: cst.ClassDef
    model: str  # attribute name of the model
    optimizer: Optional[str]  # attribute name of the optimizer (None: model-only call)
    statement: cst.BaseStatement  # the initialize line

    @classmethod
    def from_initialize(
        cls, attributes: InstanceAttributes, statement: cst.BaseStatement, target: cst.BaseExpression, call: cst.Call
    ) -> "HeldOnSelf":
        """The holder of ``<target> = amp.initialize(...)``; :class:`Blocked` for any other shape."""
        why = (
            f"`{code(target)} = amp.initialize(...)`: only `self.model, self.optimizer = "
            "amp.initialize(self.model, self.optimizer, ...)` (or of locals all unused after it) in a method "
            "of a class is followed"
        )
        facts = attributes.facts
        targets = list(target.elements) if isinstance(target, (cst.Tuple, cst.List)) else [target]
        values = [t.value if isinstance(t, cst.Element) else t for t in targets]
        positional = [a.value for a in call.args if a.keyword is None]
        method = facts.enclosing(statement, (cst.FunctionDef,))
        owner = facts.parent(facts.parent(method)) if method is not None else None
        own = attributes.receiver_of(method) if isinstance(method, cst.FunctionDef) else None
        names = [
            v.attr.value
            for v in values
            if isinstance(v, cst.Attribute) and _name_of(v.value) == own and own is not None
        ]
        if (
            not isinstance(owner, cst.ClassDef)
            or len(names) != len(values)
            or len(values) not in (1, 2)
            or len(positional) != len(values)
            or not (
                all(code(p) == code(v) for p, v in zip(positional, values))
                or all(_spent_local(facts, p, method, statement) for p in positional)
            )
        ):
            raise Blocked(call, "RPM201", why)
        return cls(attributes, owner, names[0], names[1] if len(names) == 2 else None, statement)

    @property
    def facts(self) -> ModuleFacts:
        return self.attributes.facts

    def expression(self, attribute: str, at: cst.CSTNode) -> Optional[str]:
        """``self.<attribute>`` as the method enclosing ``at`` spells it, if that method is a
        method of the holder class; else None."""
        method = self.facts.enclosing(at, (cst.FunctionDef,))
        if not isinstance(method, cst.FunctionDef) or self.facts.parent(self.facts.parent(method)) is not self.owner:
            return None
        own = self.attributes.receiver_of(method)
        return f"{own}.{attribute}" if own else None

    def held(self, node: cst.CSTNode, attribute: str) -> bool:
        """``node`` is ``self.<attribute>`` of a method of the holder class."""
        expected = self.expression(attribute, node)
        return expected is not None and isinstance(node, cst.Attribute) and code(node) == expected

    def plan_other_uses(self, plan: Plan, in_steps: Set[cst.CSTNode]) -> None:
        """Synchronize and redirect the uses outside the steps (``in_steps``: nodes the step
        rewrites cover); :class:`Blocked` for a use that is not followed."""
        attributes = {self.model, self.optimizer} - {None}
        syncs = Synchronizations(self.facts, plan)
        for node in self.facts.subtree(self.facts.module, cst.Attribute):
            if node.attr.value not in attributes or any(a in in_steps for a in self.facts.ancestors(node)):
                continue
            statement = self.facts.statement_of(node)
            if statement is self.statement or self._builds(node, statement):
                continue
            attribute = node.attr.value
            if not self.held(node, attribute):
                raise Blocked(
                    node,
                    "RPM201",
                    f"`{code(node)}` is not `self.{attribute}` of a method of class {self.owner.name.value}, "
                    "which holds amp.initialize's results; uses through other objects, nested functions or "
                    "subclasses are not followed; migrate by hand",
                )
            method = self._method_called(node)
            allowed = _MODEL_STATE + _MODES if attribute == self.model else _MODEL_STATE
            if method not in allowed:
                raise Blocked(
                    statement,
                    "RPM201",
                    f"`{code(node)}` is {self._use_of(node)} here, outside the training step, where only "
                    f"{'its state dict and train/eval mode are' if attribute == self.model else 'its state dict is'} "
                    "followed; "
                    "migrate by hand",
                )
            if attribute == self.model and method in _MODEL_STATE:
                plan.edits.replace_expression(
                    node, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model"))
                )
            if method != "train" and not syncs.before(statement, self.expression(self.model, node) or "", _WHY_SYNC):
                raise Blocked(
                    statement, "RPM201", "a state-dict use that is not a statement of a block; migrate by hand"
                )

    def _builds(self, node: cst.Attribute, statement: cst.BaseStatement) -> bool:
        """``node`` is in the method of the initialize line, before it (where the model and
        optimizer are built)."""
        method = self.facts.enclosing(self.statement, (cst.FunctionDef,))
        return (
            method is not None
            and self.facts.within(node, method)
            and self.facts.order(statement) < self.facts.order(self.statement)
            and self.held(node, node.attr.value)
        )

    def _use_of(self, node: cst.Attribute) -> str:
        """What the statement does with ``node``, in words (for a refusal)."""
        outer = self.facts.parent(node)
        if isinstance(outer, cst.Call) and outer.func is node:
            return "called (a forward pass)"
        argument = self.facts.parent(outer) if isinstance(outer, cst.Arg) else None
        if isinstance(argument, cst.Call):
            return f"passed to `{code(argument.func)}(...)` (another object holding it is not followed)"
        if isinstance(outer, cst.Assign):
            return "bound to another name (aliases are not followed)"
        return "used other than for its state dict or mode"

    def _method_called(self, node: cst.Attribute) -> Optional[str]:
        outer = self.facts.parent(node)
        call = self.facts.parent(outer) if isinstance(outer, cst.Attribute) else None
        if isinstance(outer, cst.Attribute) and isinstance(call, cst.Call) and call.func is outer:
            return outer.attr.value
        return None


def held_alias(statements: Sequence[cst.BaseStatement], held: Set[str]) -> Optional[Blocked]:
    """Why a step whose model is a local alias of a held model (``model = self.model``
    among ``statements``, ``held``: the held models' expressions there) is refused
    (RPM201), or None when no statement binds such an alias."""
    for statement in statements:
        for assign in m.findall(statement, m.Assign(targets=[m.AssignTarget(target=m.Name())])):
            assert isinstance(assign, cst.Assign)
            alias = code(assign.targets[0].target)
            if code(assign.value) in held and _calls(statements, alias):
                return Blocked(
                    statement,
                    "RPM201",
                    f"`{alias} = {code(assign.value)}`: the step calls `{alias}`, a local alias of the "
                    "attribute holding amp.initialize's model; aliases are not followed: call "
                    f"`{code(assign.value)}(...)` in the step, or migrate by hand",
                )
    return None


def _spent_local(
    facts: ModuleFacts, argument: cst.BaseExpression, method: Optional[cst.CSTNode], statement: cst.BaseStatement
) -> bool:
    """``argument`` is a plain name that ``method`` does not mention after ``statement``
    (a local handed to initialize and dropped: the attribute holds the only live reference)."""
    if not isinstance(argument, cst.Name) or method is None:
        return False
    after = facts.order(statement)
    return not [
        name
        for name in facts.subtree(method, cst.Name)
        if name.value == argument.value
        and facts.order(name) > after
        and not facts.within(name, statement)
        and not _attribute_name(facts, name)
    ]


def _attribute_name(facts: ModuleFacts, name: cst.Name) -> bool:
    """``name`` is the attribute part of ``x.<name>`` (not a variable)."""
    outer = facts.parent(name)
    return isinstance(outer, cst.Attribute) and outer.attr is name


def _calls(statements: Sequence[cst.BaseStatement], name: str) -> bool:
    """Some statement of ``statements`` calls ``name``."""
    return any(m.findall(s, m.Call(func=m.Name(name))) for s in statements)


def _name_of(node: cst.BaseExpression) -> Optional[str]:
    return node.value if isinstance(node, cst.Name) else None
