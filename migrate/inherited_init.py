"""What a trainer's ``__init__`` is handed, through its subclasses' ``super().__init__(...)``.

detectron2's ``SimpleTrainer.__init__(self, model, data_loader, optimizer)`` stores what it
is given; ``AMPTrainer(SimpleTrainer)`` builds the GradScaler in its own ``__init__`` and
hands the rest on with ``super().__init__(model, data_loader, optimizer)``; the program
builds only ``AMPTrainer(model, data_loader, optimizer)``. What ``self.model`` holds is then
what each construction passes for the subclass's ``model`` parameter.

:func:`handed_arguments` answers, for a parameter of an ``__init__`` of a class of the
family, every construction ``C(...)`` of the module whose initialisation runs that
``__init__``, with the expression that construction passes for it (None: the default).
The chain of ``__init__`` methods a construction runs is read along ``C``'s method
resolution order (its C3 linearisation over the module's classes): the first class
defining ``__init__``, then, where that one forwards with one top-level
``super().__init__(...)``, ``super(C, self).__init__(...)`` or ``Base.__init__(self, ...)``,
the next one, and so on. A forwarded value is followed outwards when it is a parameter of
the forwarding ``__init__`` (never rebound there). A construction whose chain stops before
the ``__init__`` (a subclass that does not call it) never runs it and hands it nothing.

Refused with :class:`~migrate.plan.Blocked` (RPM108), naming the statement: a class of the
family named other than to build it or as a base; a forward under a condition, in a loop,
or more than once; a forwarded value that is not a parameter; a chain that reaches a
library class (whose ``__init__`` the module does not show) before the ``__init__``; no
construction at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .names import argument_for
from .plan import Blocked
from .syntax import code, only_expression

if TYPE_CHECKING:
    from .attributes import InstanceFamily
    from .names import ModuleFacts

__all__ = ["ForwardBlocked", "Lineages", "built_class", "constructions", "forwarding_reads", "handed_arguments"]

_CODE = "RPM108"
#: A base the module does not define: its ``__init__`` is not shown (``object``'s is empty).
_Library = str
_Entry = Union[cst.ClassDef, _Library]


class ForwardBlocked(Blocked):
    """What a subclass's ``__init__`` hands on to its base's cannot be followed."""


def handed_arguments(
    facts: "ModuleFacts", family: "InstanceFamily", init: cst.FunctionDef, param: str
) -> List[Tuple[cst.Call, Optional[cst.BaseExpression]]]:
    """(construction, what it passes for ``param`` of ``init``, None for the default) for
    every construction of a class of ``family`` that runs ``init``, in source order."""
    return [(site, passed) for site, passed, _ in _handed(facts, family, init, param)]


def forwarding_reads(
    facts: "ModuleFacts", family: "InstanceFamily", init: cst.FunctionDef, param: str
) -> List[cst.Name]:
    """The reads, in the subclasses' ``__init__`` methods, of the parameters that hand
    ``param`` of ``init`` on, other than the forward itself (``isinstance(model, DDP)``)."""
    found: List[cst.Name] = []
    for _, _, links in _handed(facts, family, init, param):
        for forwarded in links:
            scope = facts.scope(forwarded)
            for read in facts.accesses(forwarded.value, scope) if scope is not None else ():
                if read is not forwarded and read not in found:
                    found.append(read)
    return found


def _handed(
    facts: "ModuleFacts", family: "InstanceFamily", init: cst.FunctionDef, param: str
) -> List[Tuple[cst.Call, Optional[cst.BaseExpression], List[cst.Name]]]:
    """:func:`handed_arguments`, each with the forwarded names of its chain's forwards."""
    owner = facts.parent(facts.parent(init))
    assert isinstance(owner, cst.ClassDef)
    lineages = Lineages(facts, family)
    found: List[Tuple[cst.Call, Optional[cst.BaseExpression], List[cst.Name]]] = []
    for site in constructions(facts, family, owner):
        chain = lineages.chain(built_class(facts, family, site), init, site)
        if chain:
            links: List[cst.Name] = []
            found.append((site, _passed(facts, site, chain, param, links), links))
    if not found:
        raise Blocked(
            init,
            _CODE,
            f"{owner.name.value}() is not built in this file (nor a subclass calling its __init__); "
            "what it is handed cannot be followed",
        )
    return found


def constructions(facts: "ModuleFacts", family: "InstanceFamily", owner: cst.ClassDef) -> List[cst.Call]:
    """Every ``C(...)`` of a class ``C`` of the family, in source order; :class:`Blocked`
    for any other use of such a class's name but as a base of a class."""
    sites: List[cst.Call] = []
    for cls in family.classes:
        scope = facts.scope(cls)
        for access in facts.accesses(cls.name.value, scope) if scope is not None else ():
            parent = facts.parent(access)
            if isinstance(parent, cst.Arg) and isinstance(facts.parent(parent), cst.ClassDef):
                continue  # a base of a class of the family
            if isinstance(parent, cst.Call) and parent.func is access:
                sites.append(parent)
                continue
            method = family.method_of(access)
            if method is not None and method.name.value == "__init__" and _explicit_forward(facts, access):
                continue  # `Base.__init__(self, ...)` in a subclass: read as a forward
            if isinstance(parent, cst.Arg) and _is_super_call(facts.parent(parent)):
                continue  # `super(Sub, self)`: the class the lookup starts after
            raise Blocked(
                access,
                _CODE,
                f"`{code(facts.statement_of(access)).strip()}` names {cls.name.value} other than to build it, "
                f"so what {owner.name.value}.__init__ is handed cannot be followed; left untouched",
            )
    return sorted(sites, key=facts.order)


def built_class(facts: "ModuleFacts", family: "InstanceFamily", site: cst.Call) -> cst.ClassDef:
    scope = facts.scope(site.func)
    assert isinstance(site.func, cst.Name) and scope is not None
    return next(
        cst.ensure_type(a.node, cst.ClassDef)
        for a in scope[site.func.value]
        if isinstance(a, Assignment) and a.node in family.classes
    )


class Lineages:
    """Method resolution orders of the family's classes and the ``__init__`` chains they run."""

    def __init__(self, facts: "ModuleFacts", family: "InstanceFamily") -> None:
        self.facts = facts
        self.family = family
        self._orders: Dict[cst.ClassDef, List[_Entry]] = {}

    def chain(self, built: cst.ClassDef, init: cst.FunctionDef, site: cst.Call) -> List[cst.FunctionDef]:
        """The ``__init__`` methods that ``built(...)`` runs, outermost first, up to
        ``init``; empty when the chain stops before it."""
        order = self.order(built, site)
        chain: List[cst.FunctionDef] = []
        position = 0
        while True:
            found = self._next_init(order, position, site)
            if found is None:
                return []
            method, position = found
            chain.append(method)
            if method is init:
                return chain
            forward = _forward_call(self.facts, method)
            if forward is None:
                return []
            if forward[1]:
                position = self._explicit_position(order, forward[0], site)

    def _explicit_position(self, order: List[_Entry], call: cst.Call, site: cst.Call) -> int:
        """Where ``Base.__init__(self, ...)`` goes on in ``order``: at ``Base``, when the
        rest of ``order`` from there is ``Base``'s own order (else :class:`Blocked`)."""
        named = self._local(cst.ensure_type(call.func, cst.Attribute).value)
        index = next((i for i, entry in enumerate(order) if entry is named), None)
        if named is None or index is None or self.order(named, site) != order[index:]:
            raise ForwardBlocked(
                call,
                _CODE,
                f"`{code(call)}` calls an __init__ other than the next one of `{code(site)}`'s classes, "
                "so what the base stores cannot be followed; left untouched",
            )
        return index

    def _next_init(self, order: Sequence[_Entry], start: int, site: cst.Call) -> Optional[Tuple[cst.FunctionDef, int]]:
        """The first ``__init__`` defined at or after ``start`` in ``order``, with the
        position after its class; None when only ``object`` follows."""
        for index in range(start, len(order)):
            entry = order[index]
            if isinstance(entry, str):
                if entry == "object":
                    continue
                raise ForwardBlocked(
                    site,
                    _CODE,
                    f"`{code(site)}` runs the __init__ of `{entry}`, a class this file does not define, "
                    "before the one that stores what it is handed; left untouched",
                )
            method = _own_init(entry)
            if method is not None:
                return method, index + 1
        return None

    def order(self, cls: cst.ClassDef, site: cst.CSTNode) -> List[_Entry]:
        """``cls``'s C3 linearisation (library bases as their spelling)."""
        found = self._orders.get(cls)
        if found is not None:
            return found
        bases: List[_Entry] = []
        for arg in cls.bases:
            if arg.keyword is None:
                local = self._local(arg.value)
                bases.append(local if local is not None else code(arg.value))
        heads: List[List[_Entry]] = [self.order(b, site) if isinstance(b, cst.ClassDef) else [b] for b in bases]
        merged = _merge([*heads, bases])
        if merged is None:
            raise Blocked(site, _CODE, f"{cls.name.value} has no consistent method resolution order")
        self._orders[cls] = [cls, *merged]
        return self._orders[cls]

    def _local(self, base: cst.BaseExpression) -> Optional[cst.ClassDef]:
        scope = self.facts.scope(base) if isinstance(base, cst.Name) else None
        assert scope is None or isinstance(base, cst.Name)
        for assignment in scope[base.value] if scope is not None and isinstance(base, cst.Name) else ():
            if isinstance(assignment, Assignment) and assignment.node in self.family.classes:
                return cst.ensure_type(assignment.node, cst.ClassDef)
        return None


def _merge(sequences: List[List[_Entry]]) -> Optional[List[_Entry]]:
    """C3's merge; None when the bases admit no order."""
    pending = [list(s) for s in sequences if s]
    merged: List[_Entry] = []
    while pending:
        head = next((s[0] for s in pending if not any(s[0] in other[1:] for other in pending)), None)
        if head is None:
            return None
        merged.append(head)
        pending = [rest for rest in ([e for e in s if e != head] for s in pending) if rest]
    return merged


def _own_init(cls: cst.ClassDef) -> Optional[cst.FunctionDef]:
    return next((s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None)


def _forward_call(facts: "ModuleFacts", method: cst.FunctionDef) -> Optional[Tuple[cst.Call, int]]:
    """The one ``super().__init__(...)`` (or ``super(C, self)``, ``Base.__init__(self, ...)``)
    of ``method``, with how many leading arguments are not the next ``__init__``'s
    (1 for ``self`` in the explicit form); None when it makes none. :class:`Blocked` when
    it makes one other than as a statement of its body (under a condition, in a loop) or
    several."""
    calls = [
        call
        for call in facts.subtree(method.body, cst.Call)
        if m.matches(call.func, m.Attribute(attr=m.Name("__init__"))) and _forwards(facts, method, call)
    ]
    if not calls:
        return None
    call = calls[0]
    statement = facts.statement_of(call)
    if len(calls) > 1 or facts.parent(statement) is not method.body or only_expression(statement) is not call:
        raise ForwardBlocked(
            call,
            _CODE,
            f"`{code(statement).strip()}` hands on to the base class's __init__ other than once, as a "
            "statement of its own in __init__, so what the base stores cannot be followed; left untouched",
        )
    owner = facts.parent(facts.parent(method))
    receiver = cst.ensure_type(call.func, cst.Attribute).value
    started = receiver.args if isinstance(receiver, cst.Call) else ()
    if started and not (isinstance(owner, cst.ClassDef) and m.matches(started[0].value, m.Name(owner.name.value))):
        raise ForwardBlocked(
            call,
            _CODE,
            f"`{code(call)}` starts the lookup after another class than its own, so what the base "
            "stores cannot be followed; left untouched",
        )
    return call, 0 if _is_super(call) else 1


def _forwards(facts: "ModuleFacts", method: cst.FunctionDef, call: cst.Call) -> bool:
    """``call`` is ``super().__init__(...)``, ``super(C, self).__init__(...)`` or
    ``Base.__init__(self, ...)`` with ``self`` the instance parameter of ``method``."""
    if _is_super(call):
        return True
    receiver = method.params.params[0].name.value if method.params.params else None
    return (
        _explicit_forward(facts, cst.ensure_type(call.func, cst.Attribute).value)
        and bool(call.args)
        and m.matches(call.args[0].value, m.Name(receiver or ""))
    )


def _is_super(call: cst.Call) -> bool:
    """``call`` is ``super(...).__init__(...)``."""
    return _is_super_call(cst.ensure_type(call.func, cst.Attribute).value)


def _is_super_call(node: Optional[cst.CSTNode]) -> bool:
    return isinstance(node, cst.Call) and m.matches(node.func, m.Name("super"))


def _explicit_forward(facts: "ModuleFacts", access: cst.CSTNode) -> bool:
    """``access`` is ``Base`` of ``Base.__init__(...)``, called."""
    attribute = facts.parent(access)
    call = facts.parent(attribute) if attribute is not None else None
    return (
        isinstance(attribute, cst.Attribute)
        and attribute.attr.value == "__init__"
        and isinstance(call, cst.Call)
        and call.func is attribute
    )


def _passed(
    facts: "ModuleFacts", site: cst.Call, chain: List[cst.FunctionDef], param: str, links: List[cst.Name]
) -> Optional[cst.BaseExpression]:
    """What ``site`` passes for ``param`` of the last ``__init__`` of ``chain``, through
    the forwards of the ones before it (their forwarded names added to ``links``)."""
    *outer, last = chain
    if not outer:
        return argument_for(site, last, param, skipped=1)
    forwarding = outer[-1]
    found = _forward_call(facts, forwarding)
    assert found is not None
    call, extra = found
    value = argument_for(call.with_changes(args=call.args[extra:]), last, param, skipped=1)
    if value is None:
        return None
    names = [p.name.value for p in forwarding.params.params[1:]]
    scope = facts.scope(call)
    bindings = list(scope[value.value]) if isinstance(value, cst.Name) and scope is not None else []
    if not (isinstance(value, cst.Name) and value.value in names and len(bindings) == 1):
        raise ForwardBlocked(
            call,
            _CODE,
            f"`{code(call)}` hands `{code(value)}` to the base class's `{param}`, which is not a parameter "
            "of this __init__ the migration can follow to the constructions; left untouched",
        )
    links.append(value)
    return _passed(facts, site, outer, value.value, links)
