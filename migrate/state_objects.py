"""Training objects held in a state object: ``state.scaler``, ``state["optim"]``...

Real training code often keeps its model, optimizer, scheduler and GradScaler in one value
that travels between functions: a dataclass or ``NamedTuple`` instance (``TrainState(model,
optimizer, scaler)``), a ``SimpleNamespace``/``argparse.Namespace``, or a dict with string
keys (``{"model": model, "scaler": GradScaler()}``). The rules follow such an object the way
they follow a name, as a *reference* written the way the code reads it (``"state.scaler"``,
``'state["scaler"]'``, see :func:`migrate.syntax.dotted`), seen from a :class:`StateField`:
one field of the state objects built by one construction, with every read of it.

A state object is followed only when the module shows every use of it
(:meth:`StateObjects.field`): the construction is bound to a plain name, returned by a
function of the module whose callers bind it to plain names, or passed to a function of the
module; every name holding it is bound once in its scope, and every call of a function
receiving it passes a followed holder; it is read through literal field names only
(``state.x``, ``state["x"]``, ``state.get("x")``), tested for presence, or aliased to a
plain name. A field of it is never written after the construction. Anything else (handed to
a function of another module or library, a key computed at run time, ``vars(state)``,
``state.update(...)``) may reach the objects where the migration cannot see: refused with
RPM125, naming the statement.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Scope

from . import templates
from .names import ModuleFacts, argument_for
from .plan import Binding, Blocked, WritePlace
from .returned import returned_targets
from .syntax import code, dotted, only_assignment, tests_presence

__all__ = ["StateField", "StateObjects", "Build"]

_CODE = "RPM125"
#: library classes whose keyword arguments become attributes of the instance
_NAMESPACES = frozenset({"types.SimpleNamespace", "argparse.Namespace"})
_DATACLASS = frozenset({"dataclasses.dataclass"})
_NAMED_TUPLE = frozenset({"typing.NamedTuple"})
#: dict methods that only read (``get`` of a literal key is a field read)
_DICT_READS = frozenset({"get", "keys"})

#: a construction of a state object: a dict display or a call of a state class
Build = Union[cst.Dict, cst.Call]


@dataclass(eq=False)
class StateField:
    """One field of the state objects ``build`` makes: stands where the rules use a scope.

    ``reads`` are the expressions reading it (``state.scaler``, ``state["scaler"]``), in
    source order; ``value`` is the expression the construction gives it."""

    build: Build
    name: str
    value: cst.BaseExpression
    reads: List[cst.BaseExpression]

    @property
    def node(self) -> cst.CSTNode:
        return self.build


@dataclass
class _Flow:
    """Where one state object goes: the names holding it and every read of those names."""

    holders: List[Tuple[Scope, str]] = field(default_factory=list)
    uses: List[cst.Name] = field(default_factory=list)
    parameters: List[Tuple[cst.FunctionDef, str]] = field(default_factory=list)
    escapes: List[Blocked] = field(default_factory=list)  # uses it cannot be followed through


class StateObjects:
    """Finds state-object constructions of a module and follows their fields."""

    def __init__(self, facts: ModuleFacts) -> None:
        self.facts = facts
        self._flows: Dict[int, _Flow] = {}  # id(build) -> its flow
        self._holder_builds: Dict[Tuple[int, str], Build] = {}  # (id(scope), name) -> build
        self._refused: Set[int] = set()  # id(build) of the objects refused (RPM125 said why)

    # ------------------------------------------------------------ constructions
    def field_given(self, value: cst.CSTNode) -> Optional[Tuple[Build, str]]:
        """(the construction, the field) when ``value`` is what a state-object construction
        gives one of its fields (``TrainState(model, opt)``, ``{"scaler": scaler}``)."""
        parent = self.facts.parent(value)
        if isinstance(parent, cst.DictElement) and parent.value is value:
            build = self.facts.parent(parent)
            key = _literal(parent.key)
            if isinstance(build, cst.Dict) and key is not None and self.fields(build) is not None:
                return build, key
            return None
        if isinstance(parent, cst.Arg) and parent.value is value:
            call = self.facts.parent(parent)
            fields = self.fields(call) if isinstance(call, cst.Call) else None
            if fields is None or not isinstance(call, cst.Call):
                return None
            for name, given in fields.items():
                if given is value:
                    return call, name
        return None

    def fields(self, build: cst.CSTNode) -> Optional[Dict[str, cst.BaseExpression]]:
        """Field name -> the expression given, when ``build`` constructs a state object whose
        fields are all given by name or position; else None."""
        if isinstance(build, cst.Dict):
            found: Dict[str, cst.BaseExpression] = {}
            for element in build.elements:
                key = _literal(element.key) if isinstance(element, cst.DictElement) else None
                if key is None or key in found:
                    return None  # `**other` or a computed key: what the dict holds is not known
                found[key] = element.value
            return found
        if not isinstance(build, cst.Call):
            return None
        names = self._class_fields(build)
        if names is None:
            return None
        found = {}
        for index, arg in enumerate(build.args):
            if arg.star:
                return None
            if arg.keyword is not None:
                found[arg.keyword.value] = arg.value
            elif names and index < len(names):
                found[names[index]] = arg.value
            else:
                return None
        return found

    def _class_fields(self, call: cst.Call) -> Optional[List[str]]:
        """The positional field order of the state class ``call`` builds ([] for keyword-only
        namespaces, ``dict(...)``); None when it builds no known state class."""
        qualified = self.facts.qualified(call.func)
        if qualified & _NAMESPACES or qualified == {"builtins.dict"}:
            return []
        cls = self._state_class(call)
        if cls is None:
            return None
        init = _plain_init(cls)
        if init is not None:
            return [p.name.value for p in init.params.params[1:]]
        return [
            s.body[0].target.value
            for s in cls.body.body
            if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.AnnAssign)
            and isinstance(s.body[0].target, cst.Name)
        ]

    def _state_class(self, call: cst.Call) -> Optional[cst.ClassDef]:
        """The class of this module ``call`` builds when it is a state class: a dataclass or
        ``NamedTuple`` without bases of its own, or a plain class whose ``__init__`` only
        stores its parameters under their names (``self.model = model``)."""
        if not isinstance(call.func, cst.Name):
            return None
        scope = self.facts.scope(call)
        classes = [
            node
            for node in (getattr(a, "node", None) for a in (scope[call.func.value] if scope is not None else ()))
            if isinstance(node, cst.ClassDef)
        ]
        if len(classes) != 1:
            return None
        cls = classes[0]
        dataclass_ = any(
            self.facts.qualified(d.decorator.func if isinstance(d.decorator, cst.Call) else d.decorator) & _DATACLASS
            for d in cls.decorators
        )
        bases = [b for b in cls.bases if not m.matches(b.value, m.Name("object"))]
        named_tuple = len(bases) == 1 and bool(self.facts.qualified(bases[0].value) & _NAMED_TUPLE)
        if (dataclass_ and not bases) or named_tuple:
            return cls
        return cls if not bases and not cls.decorators and _plain_init(cls) is not None else None

    def _methods(self, build: Build) -> List[cst.FunctionDef]:
        """The methods of the state class ``build`` builds, but a plain class's storing
        ``__init__``: they may use the fields where the migration does not follow them."""
        cls = self._state_class(build) if isinstance(build, cst.Call) else None
        if cls is None:
            return []
        init = _plain_init(cls)
        return [s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s is not init]

    # ----------------------------------------------------------------- fields
    def field(self, build: Build, name: str) -> StateField:
        """The field ``name`` of the objects ``build`` makes, with every read, else
        :class:`Blocked` (RPM125) naming the use the migration cannot follow."""
        fields = self.fields(build)
        if fields is None or name not in fields:
            raise Blocked(build, _CODE, f"{name!r} is not a field of `{code(build)[:60]}`")
        try:
            return StateField(build, name, fields[name], self._reads(build, name))
        except Blocked:
            self._refused.add(id(build))
            raise

    def _reads(self, build: Build, name: str) -> List[cst.BaseExpression]:
        flow = self._flow(build)
        if flow.escapes:
            raise flow.escapes[0]
        methods = self._methods(build)
        if methods:
            raise Blocked(
                methods[0],
                _CODE,
                f"the state class defines {methods[0].name.value}(), which may use its {name!r} where the "
                "migration does not follow it; left untouched",
            )
        reads: List[cst.BaseExpression] = []
        for use in flow.uses:
            read = self._read_of(use, build)
            if read is None or read[1] != name:
                continue
            if _written(self.facts, read[0]):
                raise Blocked(
                    read[0],
                    _CODE,
                    f"`{code(self.facts.statement_of(read[0])).strip()}` replaces the {name!r} held in the state "
                    "object, so what the state holds there cannot be followed; left untouched",
                )
            reads.append(read[0])
        return sorted(reads, key=self.facts.order)

    def lookup(self, reference: str, at: cst.CSTNode) -> Optional[Tuple[Build, str, str]]:
        """(the construction, the field, the holder's name) that ``reference`` (``"state.optimizer"``,
        ``'state["optim"]'``) reads at ``at``, when the holder holds an object already
        followed; else None."""
        try:
            node = templates.shared_expression(reference)
        except cst.ParserSyntaxError:
            return None
        found = _field_read(node)
        if found is None:
            return None
        holder, name = found
        build = self._held(holder.value, at)
        fields = self.fields(build) if build is not None else None
        if build is None or fields is None or name not in fields:
            return None
        return build, name, holder.value

    def _held(self, holder: str, at: cst.CSTNode) -> Optional[Build]:
        """The construction whose object the name ``holder`` holds at ``at``, if followed."""
        scope = self.facts.scope(at)
        while scope is not None and holder not in scope.assignments and scope.parent is not scope:
            scope = scope.parent
        return self._holder_builds.get((id(scope), holder)) if scope is not None else None

    def refused(self, node: cst.CSTNode) -> bool:
        """``node`` reads a field of a state object already refused (RPM125 said why),
        directly or through a name bound once from such a read (``scaler = state["scaler"]``)."""
        scope = self.facts.scope(node) if isinstance(node, cst.Name) else None
        bindings = self.facts.assignments(node.value, scope) if scope is not None and isinstance(node, cst.Name) else []
        target = self.facts.parent(bindings[0]) if len(bindings) == 1 else None
        bound = self.facts.parent(target) if target is not None else None
        if isinstance(bound, cst.Assign) and len(bound.targets) == 1:
            node = bound.value
        found = _field_read(node)
        build = self._held(found[0].value, node) if found is not None else None
        return build is not None and id(build) in self._refused

    def reference(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """``"state.optimizer"`` for a read of a field of a followed state object."""
        written = dotted(node) if isinstance(node, (cst.Attribute, cst.Subscript)) else None
        if written is None or node is None or self.lookup(written, node) is None:
            return None
        return written

    def binding(
        self, reference: str, at: cst.CSTNode, lookup: Callable[[str, cst.CSTNode], Binding]
    ) -> Optional[Binding]:
        """Where the object ``reference`` reads at ``at`` is bound: the binding of the name
        the construction gives (``lookup(name, at)``, the rules' own), or the construction's
        statement for an object built in place (``{"optim": SGD(...)}``); None when
        ``reference`` reads no followed state object."""
        found = self.lookup(reference, at)
        if found is None:
            return None
        build, name, _ = found
        value = self.field(build, name).value
        if isinstance(value, cst.Name):
            return lookup(value.value, build)
        statement = self.facts.statement_of(build)
        if not isinstance(value, cst.Call) or not isinstance(statement, cst.SimpleStatementLine):
            raise Blocked(value, "RPM108", f"the state's {name!r} is not a name or a call of this file")
        return Binding(self.facts.scope(build), "", statement, value)  # "": origins.INLINE

    def model_reference(self, optimizer: str, model: str, at: cst.CSTNode) -> Optional[str]:
        """How ``at`` reads the model ``model`` (a name given to the construction) when it
        reads the optimizer through a state object (``optimizer`` is ``"state.optimizer"``):
        the reference of the one field holding that name (``"state.model"``); None when the
        optimizer is not read through a state object.

        Raises :class:`Blocked` (RPM125) when no field, or several, hold the model."""
        found = self.lookup(optimizer, at)
        if found is None:
            return None
        build, _, holder = found
        fields = self.fields(build) or {}
        names = [n for n, v in fields.items() if isinstance(v, cst.Name) and v.value == model]
        if len(names) != 1:
            raise Blocked(
                build,
                _CODE,
                f"the state object holds the optimizer {optimizer!r} but not its model {model!r} in one field, "
                "so the step cannot reach the wrapped model; left untouched",
            )
        return f"{holder}[{json.dumps(names[0])}]" if isinstance(build, cst.Dict) else f"{holder}.{names[0]}"

    def places(self, optimizer: str, model: str, at: cst.CSTNode) -> List[WritePlace]:
        """Where code may write the state of the optimizer that ``at`` reads as ``optimizer``
        (``'state["optim"]'``) while a step of ``model`` runs: every function or module
        holding that state object, with how it reads the optimizer and the model, at any
        time (no anchors); empty when the optimizer is not read through one."""
        found = self.lookup(optimizer, at)
        reads_model = self.lookup(model, at)
        if found is None or reads_model is None or reads_model[0] is not found[0]:
            return []
        build, field_name, _ = found
        flow = self._flow(build)

        def spelled(holder: str, name: str) -> str:
            return f"{holder}[{json.dumps(name)}]" if isinstance(build, cst.Dict) else f"{holder}.{name}"

        return [
            WritePlace(
                self.facts.function_of(scope) or self.facts.module,
                spelled(name, field_name),
                spelled(name, reads_model[1]),
                None,
            )
            for scope, name in flow.holders
        ]

    # ------------------------------------------------------------------ flow
    def _flow(self, build: Build) -> _Flow:
        found = self._flows.get(id(build))
        if found is None:
            found = self._flows[id(build)] = _Flow()
            try:
                self._follow_value(build, build, found, 0)
                self._check_callers(build, found)
            except Blocked as blocked:
                found.escapes.append(blocked)
        return found

    def _follow_value(self, value: cst.BaseExpression, build: Build, flow: _Flow, depth: int) -> None:
        """Follow an expression holding the state object to the names that hold it next."""
        parent = self.facts.parent(value)
        if depth > 6:
            raise self._escape(value, "goes through too many functions")
        if isinstance(parent, cst.Assign) and parent.value is value:
            names = [t.target for t in parent.targets if isinstance(t.target, cst.Name)]
            if len(names) != len(parent.targets):
                raise self._escape(value, "is stored in an attribute or container")
            for target in names:
                self._hold(self.facts.scope(parent), target.value, build, flow, depth)
            return
        if isinstance(parent, cst.Arg) and parent.value is value and not parent.star:
            call = self.facts.parent(parent)
            function = self.facts.local_function(call) if isinstance(call, cst.Call) else None
            if function is None or not isinstance(call, cst.Call):
                raise self._escape(
                    value,
                    f"is handed to `{code(call.func) if isinstance(call, cst.Call) else '?'}(...)`, defined elsewhere",
                )
            param = _parameter(call, function, parent)
            if param is None:
                raise self._escape(value, f"is passed to {function.name.value}() through *args/**kwargs")
            flow.parameters.append((function, param))
            self._hold(self.facts.scope(function.body.body[0]), param, build, flow, depth + 1)
            return
        if isinstance(parent, (cst.Return, cst.Element)):
            try:
                returned = returned_targets(self.facts, value)
            except Blocked as blocked:
                raise Blocked(blocked.node, _CODE, blocked.message)
            if returned is None:
                raise self._escape(value, "is put in a container")
            for scope, name, _ in returned:
                self._hold(scope, name, build, flow, depth + 1)
            return
        if isinstance(parent, cst.Expr):
            return  # built and dropped
        raise self._escape(value, "is used in an expression the migration does not follow")

    def _hold(self, scope: Optional[Scope], name: str, build: Build, flow: _Flow, depth: int) -> None:
        if scope is None or (scope, name) in flow.holders:
            return
        bindings = self.facts.assignments(name, scope)
        if len(bindings) != 1:
            raise Blocked(
                bindings[1] if len(bindings) > 1 else build,
                _CODE,
                f"{name!r} holds the state object but is bound more than once in its scope, so what it "
                "holds cannot be followed; left untouched",
            )
        other = self._holder_builds.get((id(scope), name))
        if other is not None and other is not build:
            raise Blocked(bindings[0], _CODE, f"{name!r} holds state objects built in different places")
        flow.holders.append((scope, name))
        self._holder_builds[(id(scope), name)] = build
        for use in self.facts.accesses(name, scope):
            flow.uses.append(use)
            try:  # every use is looked at, so that every holder is known (see `refused`)
                self._follow_use(use, build, flow, depth)
            except Blocked as blocked:
                flow.escapes.append(blocked)

    def _follow_use(self, use: cst.Name, build: Build, flow: _Flow, depth: int) -> None:
        parent = self.facts.parent(use)
        if self._read_of(use, build) is not None or tests_presence(parent, use):
            return
        if isinstance(parent, cst.Attribute) and parent.value is use and not isinstance(build, cst.Dict):
            if not parent.attr.value.startswith("_"):
                return  # another field (`state.step += 1`): not one the migration follows
        if isinstance(parent, cst.Subscript) and parent.value is use and isinstance(build, cst.Dict):
            if _literal_subscript(parent) is not None:
                return  # another key (`state["step"] += 1`)
            raise self._escape(use, "is read with a key computed at run time")
        if isinstance(parent, cst.Attribute) and parent.value is use and parent.attr.value in _DICT_READS:
            return
        self._follow_value(use, build, flow, depth)

    def _read_of(self, use: cst.Name, build: Build) -> Optional[Tuple[cst.BaseExpression, str]]:
        """(the read expression, the field) when ``use`` reads a field of the object."""
        parent = self.facts.parent(use)
        if isinstance(build, cst.Dict):
            if isinstance(parent, cst.Subscript) and parent.value is use:
                key = _literal_subscript(parent)
                return (parent, key) if key is not None else None
            call = self.facts.parent(parent) if isinstance(parent, cst.Attribute) else None
            if (
                isinstance(call, cst.Call)
                and isinstance(parent, cst.Attribute)
                and call.func is parent
                and parent.attr.value == "get"
            ):
                key = _literal(call.args[0].value) if len(call.args) == 1 else None
                return (call, key) if key is not None else None
            return None
        if (
            isinstance(parent, cst.Attribute)
            and parent.value is use
            and parent.attr.value in (self.fields(build) or {})
        ):
            return parent, parent.attr.value
        return None

    def _check_callers(self, build: Build, flow: _Flow) -> None:
        """Every call of a function receiving the object passes a holder of it (else its
        reads may see another object)."""
        held = {id(use) for use in flow.uses} | {id(build)}
        for function, param in flow.parameters:
            for site in self.facts.call_sites(function):
                given = argument_for(site, function, param)
                if given is None or id(given) not in held:
                    raise Blocked(
                        site,
                        _CODE,
                        f"{function.name.value}() receives the state object as {param!r} but is also called "
                        "with something else there, so its reads cannot be followed; left untouched",
                    )

    def _escape(self, node: cst.CSTNode, how: str) -> Blocked:
        statement = code(self.facts.statement_of(node)).strip()
        return Blocked(
            node,
            _CODE,
            f"`{statement}`: the state object holding the training objects {how}, where the migration "
            "cannot see what is done with them; left untouched",
        )


def _plain_init(cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
    """The ``__init__`` of a class whose body holds nothing else (but a docstring, ``pass``
    and annotations) and which only stores each parameter under its own name."""
    init: Optional[cst.FunctionDef] = None
    for statement in cls.body.body:
        if isinstance(statement, cst.FunctionDef) and statement.name.value == "__init__" and init is None:
            init = statement
        elif not (
            isinstance(statement, cst.SimpleStatementLine)
            and all(isinstance(s, (cst.Expr, cst.Pass, cst.AnnAssign)) for s in statement.body)
        ):
            return None
    if init is None or init.decorators or isinstance(init.params.star_arg, (cst.Param, cst.ParamStar)):
        return None
    if init.params.kwonly_params or init.params.star_kwarg:
        return None
    params = [p.name.value for p in init.params.params]
    if not params or init.params.posonly_params:
        return None
    stored = set()
    for statement in init.body.body:
        small = only_assignment(statement)
        target = small.targets[0].target if small is not None and len(small.targets) == 1 else None
        if not (
            isinstance(target, cst.Attribute)
            and m.matches(target.value, m.Name(params[0]))
            and m.matches(small.value, m.Name(target.attr.value))  # type: ignore[union-attr]
            and target.attr.value in params[1:]
        ):
            return None
        stored.add(target.attr.value)
    return init if stored == set(params[1:]) else None


def _literal(node: Optional[cst.BaseExpression]) -> Optional[str]:
    """The text of a plain string literal (no f-string, no concatenation), else None."""
    if isinstance(node, cst.SimpleString) and node.prefix.lower() in ("", "u"):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _literal_subscript(node: cst.Subscript) -> Optional[str]:
    if len(node.slice) != 1 or not isinstance(node.slice[0].slice, cst.Index):
        return None
    return _literal(node.slice[0].slice.value)


def _field_read(node: cst.CSTNode) -> Optional[Tuple[cst.Name, str]]:
    """(holder, field) of ``holder.field`` or ``holder["field"]``."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name):
        return node.value, node.attr.value
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Name):
        key = _literal_subscript(node)
        return (node.value, key) if key is not None else None
    return None


def _written(facts: ModuleFacts, node: cst.CSTNode) -> bool:
    parent = facts.parent(node)
    if isinstance(parent, (cst.AssignTarget, cst.Del)):
        return True
    return isinstance(parent, (cst.AugAssign, cst.AnnAssign)) and parent.target is node


def _parameter(call: cst.Call, function: cst.FunctionDef, arg: cst.Arg) -> Optional[str]:
    names = [p.name.value for p in function.params.params]
    if arg.keyword is not None:
        return arg.keyword.value if arg.keyword.value in names else None
    index = list(call.args).index(arg)
    return names[index] if index < len(names) and not arg.star else None
