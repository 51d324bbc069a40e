"""Objects held in instance attributes of one class: ``self.scaler``, ``self.model``...

A trainer class keeps its GradScaler, model, optimizer and scheduler on ``self``. The rules
follow such an object the way they follow a local name, as a *reference*
``"<receiver>.<attr>"`` (``"self.scaler"``) seen from an :class:`InstanceFamily`: the
classes of the module that share instances (a class with its bases and subclasses defined
in the module). The family stands where the rules use a libcst scope for a name: it says
where the attribute is bound and where it is read, in every method of those classes.

An attribute is followed only when the module shows every use of it
(:meth:`InstanceFamily.follow`): bound exactly once, by a plain assignment in a method of
the family; read through the instance parameter (the first parameter of a method) spelled
the same way everywhere; reached through instances from outside the classes only for
``is None`` tests and the read-only methods the caller allows (a step's model and optimizer
through a name bound to a construction of the class, ``trainer.model``, are refused at the
end of the planning unless a rule claims them: :mod:`migrate.instance_outside`). A class deriving from a
class that is not defined in the module (other than Python's and torch's own) may use the
attribute in methods the module does not show: refused too. Every refusal is
:class:`~migrate.plan.Blocked` with RPM120, naming the statement.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

import libcst as cst
from libcst.metadata import Assignment

from .branch_scalers import scaler_in_branches
from .instance_outside import built_instance, step_objects, step_optimizers
from .lazy_attributes import lazy_binding
from .names import ModuleFacts, argument_for
from .plan import Binding, Blocked, WritePlace
from .syntax import code, only_assignment, tests_presence

__all__ = [
    "InstanceAttributes",
    "InstanceFamily",
    "TrackedAttribute",
    "check_wrap",
    "instance_places",
    "wrap_where_bound",
    "wrapped",
]

_CODE = "RPM120"
#: Bases that never touch a subclass's attributes: Python's and torch's own classes.
_LIBRARY_BASES = ("builtins.", "abc.", "typing.", "torch.")
_NOT_METHODS = {"staticmethod", "classmethod"}


@dataclass(frozen=True)
class TrackedAttribute:
    """An attribute the family accounts for: its one binding and its reads in the family."""

    reference: str  # "self.scaler", as every method of the family spells it
    statement: cst.SimpleStatementLine  # the one `self.scaler = ...` line
    value: cst.BaseExpression
    reads: Tuple[cst.Attribute, ...]  # `self.scaler` loads in the family's methods, source order


@dataclass(eq=False)
class InstanceFamily:
    """Classes of one module sharing instances, with their methods' instance parameters."""

    facts: ModuleFacts
    classes: Tuple[cst.ClassDef, ...]
    methods: Dict[cst.FunctionDef, str]  # method -> the name of its instance parameter
    foreign_bases: Tuple[cst.Arg, ...]  # bases not defined in the module (nor library ones)
    resolver: "InstanceAttributes"
    _followed: Dict[str, TrackedAttribute] = field(default_factory=dict)
    # outside uses of a step's objects through a built instance, refused unless a rule claims them
    _deferred: Dict[cst.Attribute, Blocked] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.classes[0].name.value

    def follow(self, attr: str, outside_reads: FrozenSet[str] = frozenset()) -> TrackedAttribute:
        """The attribute ``attr`` with every use accounted for, else :class:`Blocked`.
        ``outside_reads`` are the methods that code outside the family may call on it
        (``trainer.scaler.get_scale()``); the first call decides them."""
        found = self._followed.get(attr)
        if found is None:
            found = self._followed[attr] = self._account_for(attr, outside_reads)
        return found

    def method_of(self, node: cst.CSTNode) -> Optional[cst.FunctionDef]:
        """The family method ``node`` is in (directly or in a function nested in it)."""
        for ancestor in self.facts.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef) and ancestor in self.methods:
                return ancestor
        return None

    def runs_after(self, node: cst.CSTNode, after: int) -> bool:
        """``node`` may run after the statement at source rank ``after`` (in a method of the
        family): it is in another method, or later in that one."""
        holding = [method for method in self.methods if self.facts.order(method) <= after]
        method = max(holding, key=self.facts.order) if holding else None
        return self.method_of(node) is not method or self.facts.order(node) > after

    def deferred_uses(self, attr: str) -> List[cst.Attribute]:
        """The outside uses of ``.attr`` through a built instance that no rule claimed yet
        (:mod:`migrate.instance_outside`), in source order."""
        uses = [node for node in self._deferred if node.attr.value == attr]
        return sorted(uses, key=self.facts.order)

    def claim(self, use: cst.Attribute) -> None:
        """A rule orders ``use`` (one of :meth:`deferred_uses`) after the running step."""
        self._deferred.pop(use, None)

    def unclaimed(self) -> List[Blocked]:
        """The refusals of the deferred outside uses no rule claimed."""
        return list(self._deferred.values())

    def methods_besides(self, *skipped: Optional[cst.FunctionDef]) -> List[cst.FunctionDef]:
        """The family's methods but ``__init__`` (no step of an instance in construction can
        be running) and ``skipped``, in source order."""
        return [m for m in self.methods if m.name.value != "__init__" and m not in skipped]

    # ----------------------------------------------------------------- accounting
    def _account_for(self, attr: str, outside_reads: FrozenSet[str]) -> TrackedAttribute:
        if self.foreign_bases:
            base = self.foreign_bases[0]
            raise Blocked(
                base,
                _CODE,
                f"{self.name} derives from `{code(base.value)}`, which is not defined in this file: "
                f"its methods may use self.{attr} in ways the migration cannot see; left untouched",
            )
        uses = [
            node
            for cls in self.classes
            for node in self.facts.subtree(cls, cst.Attribute)
            if node.attr.value == attr and self.through_receiver(node)
        ]
        writes = [node for node in uses if _is_target(self.facts, node)]
        if not writes:
            raise Blocked(uses[0] if uses else self.classes[0], _CODE, f"self.{attr} is never bound in {self.name}")
        lazy = lazy_binding(self, writes) if len(writes) == 2 else None  # `if self.x is None: self.x = ...`
        lazy = lazy or scaler_in_branches(self, writes)  # `if dynamic: self.s = GradScaler() else: ...`
        skipped = [w for w in writes if w is not lazy] if lazy is not None else []
        writes = [lazy] if lazy is not None else writes
        statement = self.facts.statement_of(writes[0])
        if len(writes) > 1:
            lines = ", ".join(str(self.facts.line(w)) for w in writes)
            raise Blocked(
                writes[1],
                _CODE,
                f"`{code(self.facts.statement_of(writes[1])).strip()}`: self.{attr} is bound more "
                f"than once in {self.name} (lines {lines}), so the object it holds cannot be "
                "followed; left untouched",
            )
        small = only_assignment(statement)
        if not (small is not None and len(small.targets) == 1 and small.targets[0].target is writes[0]):
            raise Blocked(
                writes[0],
                _CODE,
                f"`{code(statement).strip()}` binds self.{attr} other than by a plain assignment; left untouched",
            )
        reference = code(writes[0])
        for use in uses:
            if code(use) != reference:
                raise Blocked(
                    use,
                    _CODE,
                    f"`{code(use)}` names the instance differently from `{reference}` "
                    f"(line {self.facts.line(writes[0])}); left untouched",
                )
        self._check_outside(attr, outside_reads)
        reads = tuple(sorted((u for u in uses if u is not writes[0] and u not in skipped), key=self.facts.order))
        assert isinstance(statement, cst.SimpleStatementLine) and isinstance(small, cst.Assign)
        return TrackedAttribute(reference, statement, small.value, reads)

    @cached_property
    def step_optimizers(self) -> Dict[str, FrozenSet[str]]:
        """:func:`migrate.instance_outside.step_optimizers` of this family, worked out once
        (its classes do not change while the rules plan)."""
        return step_optimizers(self)

    def through_receiver(self, node: cst.Attribute) -> bool:
        """``node`` is ``self.x`` read through an instance parameter of one of the family's methods."""
        return isinstance(node.value, cst.Name) and self.resolver.method_of_receiver(node.value) in self.methods

    def _check_outside(self, attr: str, allowed: FrozenSet[str]) -> None:
        """Uses of ``.attr`` on objects that may be instances of the family, from outside it:
        only ``is None`` tests and the ``allowed`` method calls. A use of a step's object
        through a built instance (``trainer.optimizer``) is refused later unless a rule
        claims it (:mod:`migrate.instance_outside`)."""
        deferred = attr in step_objects(self)
        for node in self.outside_uses(attr):
            parent = self.facts.parent(node)
            if tests_presence(parent, node):
                continue
            method = parent.attr.value if isinstance(parent, cst.Attribute) and parent.value is node else None
            call = self.facts.parent(parent) if method else None
            if method in allowed and isinstance(call, cst.Call) and call.func is parent:
                continue
            statement = self.facts.statement_of(node)
            blocked = Blocked(
                node,
                _CODE,
                f"`{code(statement).strip()}` uses `.{attr}` of what may be a {self.name} instance "
                f"from outside the class; the object in self.{attr} changes with the migration, so "
                "every use of it must be in the class; left untouched",
            )
            if not (deferred and built_instance(self, node.value)):
                raise blocked
            self._deferred[node] = blocked

    def outside_uses(self, attr: str) -> List[cst.Attribute]:
        """The ``x.attr`` nodes of the module, outside the family's methods, whose ``x`` may
        be an instance of the family (not a module name in an import), in source order."""
        return [
            node
            for node in self.facts.subtree(self.facts.module, cst.Attribute)
            if node.attr.value == attr
            and not self.through_receiver(node)
            and self.may_be_instance(node.value)
            # `from torch.optim.lr_scheduler import LambdaLR`: a module's name
            and self.facts.enclosing(node, (cst.Import, cst.ImportFrom)) is None
        ]

    def may_be_instance(self, value: cst.BaseExpression, depth: int = 0) -> bool:
        """``value`` may hold an instance of the family. Not: another attribute of the
        family's instance, another class's instance parameter, a name bound only by
        imports and by calls of things that cannot return one (``parser.parse_args()``,
        ``torch.load(...)``: anything but the family's classes and this module's
        functions), or a parameter every caller in the module passes such a value."""
        if isinstance(value, cst.Attribute) and self.through_receiver(value):
            return False
        if isinstance(value, cst.Call):
            return self._may_return_instance(value)
        if not isinstance(value, cst.Name) or depth > 3:
            return True
        if self.resolver.method_of_receiver(value) is not None:
            return False  # another class's instance parameter: its own attribute
        scope = self.facts.scope(value)
        assignments = [a for a in scope[value.value] if isinstance(a, Assignment)] if scope is not None else []
        if not assignments:
            return True
        for assignment in assignments:
            node = assignment.node
            if isinstance(node, (cst.Import, cst.ImportFrom)):
                continue
            if isinstance(node, cst.Param):
                if self._passed_instance(node, depth):
                    return True
                continue
            statement = self.facts.statement_of(node) if isinstance(node, cst.CSTNode) else None
            small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
            if not (isinstance(small, cst.Assign) and isinstance(small.value, cst.Call)):
                return True
            if self._may_return_instance(small.value):
                return True
        return False

    def _may_return_instance(self, call: cst.Call) -> bool:
        return self.resolver.constructs(call, self) or self.facts.local_function(call) is not None

    def _passed_instance(self, param: cst.Param, depth: int) -> bool:
        """A caller in this module may pass an instance for ``param`` (or there is none)."""
        function = self.facts.parent(self.facts.parent(param))
        sites = self.facts.call_sites(function) if isinstance(function, cst.FunctionDef) else []
        if not sites:
            return True
        for site in sites:
            passed = argument_for(site, function, param.name.value)  # type: ignore[arg-type]
            if passed is None or self.may_be_instance(passed, depth + 1):
                return True
        return False


class InstanceAttributes:
    """Finds instance parameters, instance-attribute references and their families."""

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self._families: Dict[cst.ClassDef, InstanceFamily] = {}

    def unclaimed(self) -> List[Blocked]:
        """The refusals of every family's outside uses that no rule claimed."""
        families = {id(f): f for f in self._families.values()}
        return [blocked for family in families.values() for blocked in family.unclaimed()]

    def method_of_receiver(self, name: cst.Name) -> Optional[cst.FunctionDef]:
        """The method whose instance parameter ``name`` reads, else None."""
        scope = self.facts.scope(name)
        assignments = [a for a in scope[name.value] if isinstance(a, Assignment)] if scope is not None else []
        if len(assignments) != 1 or not isinstance(assignments[0].node, cst.Param):
            return None
        param = assignments[0].node
        function = self.facts.parent(self.facts.parent(param))
        if not isinstance(function, cst.FunctionDef) or self.receiver_of(function) != param.name.value:
            return None
        return function

    def reference(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """What the rules follow ``node`` as: a plain name, or ``recv.attr`` with ``recv`` a
        method's instance parameter; None for anything else."""
        if isinstance(node, cst.Name):
            return node.value
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
            if self.method_of_receiver(node.value) is not None:
                return f"{node.value.value}.{node.attr.value}"
        return None

    def family_of_attribute(self, node: cst.Attribute) -> Optional[InstanceFamily]:
        """The family whose instance ``node`` (``self.x``) is an attribute of."""
        method = self.method_of_receiver(node.value) if isinstance(node.value, cst.Name) else None
        cls = self.facts.parent(self.facts.parent(method)) if method is not None else None
        return self._family(cls) if isinstance(cls, cst.ClassDef) else None

    def family_of_class(self, cls: cst.ClassDef) -> InstanceFamily:
        """The family ``cls`` (a class of the module) belongs to."""
        return self._family(cls)

    def binding(self, reference: str, at: cst.CSTNode, outside_reads: FrozenSet[str] = frozenset()) -> Binding:
        """Where ``reference`` (``"self.optimizer"``, seen from ``at``) is bound, as a
        :class:`Binding` whose scope is the family."""
        receiver, _, attr = reference.partition(".")
        scope = self.facts.scope(at)
        assignments = [a for a in scope[receiver] if isinstance(a, Assignment)] if scope is not None else []
        param = assignments[0].node if len(assignments) == 1 else None
        family = None
        if isinstance(param, cst.Param):
            method = self.facts.parent(self.facts.parent(param))
            cls = self.facts.parent(self.facts.parent(method)) if isinstance(method, cst.FunctionDef) else None
            family = self._family(cls) if isinstance(cls, cst.ClassDef) else None
        if family is None or "." in attr:
            raise Blocked(at, "RPM108", f"{reference!r} is not an attribute of a class of this file")
        tracked = family.follow(attr, outside_reads)
        return Binding(family, tracked.reference, tracked.statement, tracked.value)

    def constructs(self, call: cst.Call, family: InstanceFamily) -> bool:
        """``call`` builds an instance of a class of ``family`` (called by its name)."""
        if not isinstance(call.func, cst.Name):
            return False
        scope = self.facts.scope(call.func)
        bindings = scope[call.func.value] if scope is not None else ()
        return any(isinstance(a, Assignment) and a.node in family.classes for a in bindings)

    # ------------------------------------------------------------------ families
    def receiver_of(self, function: cst.FunctionDef) -> Optional[str]:
        """The instance parameter's name of a method (a function directly in a class body,
        not a static or class method), else None."""
        block = self.facts.parent(function)
        if not isinstance(self.facts.parent(block), cst.ClassDef):
            return None
        for decorator in function.decorators:
            if isinstance(decorator.decorator, cst.Name) and decorator.decorator.value in _NOT_METHODS:
                return None
        params = [*function.params.posonly_params, *function.params.params]
        return params[0].name.value if params else None

    def _family(self, cls: cst.ClassDef) -> InstanceFamily:
        found = self._families.get(cls)
        if found is not None:
            return found
        classes = self.facts.subtree(self.facts.module, cst.ClassDef)
        bases: Dict[cst.ClassDef, Set[cst.ClassDef]] = {c: set() for c in classes}
        foreign: Dict[cst.ClassDef, List[cst.Arg]] = {c: [] for c in classes}
        for each in classes:
            for base in each.bases:
                if base.keyword is not None:
                    continue
                local = self._local_class(base.value, classes)
                if local is not None:
                    bases[each].add(local)
                    bases[local].add(each)
                elif not self._library_class(base.value):
                    foreign[each].append(base)
        members: List[cst.ClassDef] = []
        waiting = [cls]
        while waiting:
            current = waiting.pop()
            if current not in members:
                members.append(current)
                waiting.extend(bases[current])
        members.sort(key=lambda c: (c is not cls, self.facts.order(c)))
        methods: Dict[cst.FunctionDef, str] = {}
        for member in members:
            for statement in member.body.body:
                receiver = self.receiver_of(statement) if isinstance(statement, cst.FunctionDef) else None
                if receiver is not None:
                    methods[statement] = receiver  # type: ignore[index]
        family = InstanceFamily(
            self.facts, tuple(members), methods, tuple(a for c in members for a in foreign[c]), self
        )
        for member in members:
            self._families[member] = family
        return family

    def _local_class(self, base: cst.BaseExpression, classes: List[cst.ClassDef]) -> Optional[cst.ClassDef]:
        if not isinstance(base, cst.Name):
            return None
        scope = self.facts.scope(base)
        for assignment in scope[base.value] if scope is not None else ():
            if isinstance(assignment, Assignment) and assignment.node in classes:
                return cst.ensure_type(assignment.node, cst.ClassDef)
        return None

    def _library_class(self, base: cst.BaseExpression) -> bool:
        names = self.facts.qualified(base)
        if isinstance(base, cst.Name) and base.value == "object":
            return True
        return bool(names) and all(name.startswith(_LIBRARY_BASES) for name in names)


def check_wrap(family: InstanceFamily, model: str, optimizer: Binding) -> None:
    """The model wrap goes right before the optimizer's binding, as for names: that must
    run once per instance (in ``__init__``, not in a loop), after the model attribute's one
    binding, a construction in the same ``__init__`` (a model handed in by the caller would
    stay unwrapped there)."""
    statement = optimizer.statement
    assert statement is not None
    if "." not in model:
        raise Blocked(
            statement,
            _CODE,
            f"`{code(statement).strip()}` builds the optimizer of {family.name} on `{model}`, not on a "
            f"model held in an attribute of {family.name}; left untouched",
        )
    method = family.method_of(statement)
    if method is None or method.name.value != "__init__" or family.facts.enclosing(statement, (cst.For, cst.While)):
        raise Blocked(
            statement,
            _CODE,
            f"`{code(statement).strip()}` builds the optimizer outside {family.name}.__init__ (or in a loop): "
            "the model would be wrapped each time it runs; left untouched",
        )
    tracked = family.follow(model.partition(".")[2])
    if (
        family.method_of(tracked.statement) is not method
        or family.facts.order(tracked.statement) > family.facts.order(statement)
        or not isinstance(tracked.value, cst.Call)
        or _called_on_parameter(tracked.value, method)
    ):
        raise Blocked(
            tracked.statement,
            _CODE,
            f"`{code(tracked.statement).strip()}`: the model is not built in {family.name}.__init__ before "
            "its optimizer (a model handed in by the caller would stay unwrapped there); left untouched",
        )


def _called_on_parameter(call: cst.Call, method: cst.FunctionDef) -> bool:
    """``model.to(device)``, ``model.cuda()``: a method of an object the caller hands in
    (which returns that same object, still the caller's)."""
    func = call.func
    while isinstance(func, (cst.Attribute, cst.Call)):
        func = func.value if isinstance(func, cst.Attribute) else func.func
    parameters = [*method.params.posonly_params, *method.params.params, *method.params.kwonly_params]
    return (
        isinstance(call.func, cst.Attribute)
        and isinstance(func, cst.Name)
        and func.value in {p.name.value for p in parameters}
    )


def wrap_where_bound(optimizer: Binding, model: str) -> Optional[cst.Call]:
    """The construction to wrap in place (``self.model = Net()``) when the optimizer's
    binding is an instance family's and comes right after the model's (nothing runs
    between, so wrapping the model where it is built rather than right before the
    optimizer changes nothing, not even the random numbers drawn); else None."""
    family = optimizer.scope
    if not isinstance(family, InstanceFamily) or optimizer.statement is None:
        return None
    tracked = family.follow(model.partition(".")[2])
    block = family.facts.parent(tracked.statement)
    body = list(getattr(block, "body", ()))
    index = body.index(tracked.statement)
    if body[index + 1 : index + 2] != [optimizer.statement] or not isinstance(tracked.value, cst.Call):
        return None
    return tracked.value


def wrapped(template: str, module: cst.BaseExpression) -> cst.Call:
    """``template`` (a call whose first argument is ``_``) with ``module`` as that argument."""
    call = cst.parse_expression(template)
    assert isinstance(call, cst.Call)
    return call.with_changes(args=[call.args[0].with_changes(value=module), *call.args[1:]])


def instance_places(
    family: InstanceFamily, function: Optional[cst.FunctionDef], backward: cst.CSTNode, optimizer: str, model: str
) -> List[WritePlace]:
    """Where main-thread writes of an instance's optimizer may race with its running step,
    for the step builder: the step's method (all of
    it when no loop of its own holds the step: it runs once per step), and every other
    method but ``__init__``, whenever it is called (anchors None: any statement may)."""
    in_loop = function is not None and any(
        isinstance(a, (cst.For, cst.While)) and family.facts.within(a, function)
        for a in family.facts.ancestors(backward)
    )
    own: Optional[List[cst.CSTNode]] = [backward] if in_loop or function is None else None
    places = [WritePlace(function or family.facts.module, optimizer, model, own)]
    places += [WritePlace(method, optimizer, model, None) for method in family.methods_besides(function)]
    return places


def _is_target(facts: ModuleFacts, node: cst.CSTNode) -> bool:
    """``node`` is (part of) what a statement binds or deletes: an assignment, ``for`` or
    ``with ... as`` target, or ``del``."""
    child, parent = node, facts.parent(node)
    while isinstance(parent, (cst.Tuple, cst.List, cst.Element, cst.StarredElement)):
        child, parent = parent, facts.parent(parent)
    if isinstance(parent, (cst.AssignTarget, cst.AsName, cst.Del)):
        return True
    if isinstance(parent, (cst.AugAssign, cst.AnnAssign, cst.For, cst.CompFor)):
        return parent.target is child
    return False
