"""An attribute a trainer builds lazily: ``None`` in ``__init__``, built when first needed.

Hugging Face-style trainers accept an optional optimizer and scheduler and build them in a
method when none was given::

    def __init__(self, model, optimizer=None):
        self.optimizer = optimizer
    def create_optimizer(self):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=...)

When every construction of the class in the module passes nothing or ``None`` for that
parameter (or ``__init__`` binds ``None`` itself), the attribute only ever holds ``None`` or
what the guarded assignment builds, so that assignment is its binding
(:func:`lazy_binding`) and the rules follow it as the one binding of the attribute.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst
import libcst.matchers as m

from .inherited_init import handed_arguments
from .plan import Blocked
from .syntax import code, only_assignment

if TYPE_CHECKING:
    from .attributes import InstanceFamily

__all__ = ["lazy_binding"]


def lazy_binding(family: "InstanceFamily", writes: List[cst.Attribute]) -> Optional[cst.Attribute]:
    """Of the two ``writes`` of an attribute, the guarded one (``if self.x is None: self.x =
    ...``) when the other, in ``__init__``, binds ``None`` or a parameter that every
    construction leaves ``None``; else None."""
    if len(writes) != 2:
        return None
    facts = family.facts
    first, second = sorted(writes, key=lambda w: 0 if _in_init(family, w) else 1)
    if not _in_init(family, first) or not _guarded_by_none_test(family, second):
        return None
    value = _assigned_value(family, first)
    if value is None:
        return None
    if m.matches(value, m.Name("None")):
        return second
    init = family.method_of(first)
    names = [p.name.value for p in init.params.params[1:]] if init is not None else []
    if init is None or not isinstance(value, cst.Name) or value.value not in names:
        return None
    try:
        handed = handed_arguments(facts, family, init, value.value)
    except Blocked:
        return None  # a construction the module does not show could hand one in
    for _, passed in handed:
        if passed is not None and not m.matches(passed, m.Name("None")):
            return None
    return second


def _in_init(family: "InstanceFamily", node: cst.CSTNode) -> bool:
    method = family.method_of(node)
    return (
        method is not None
        and method.name.value == "__init__"
        and family.facts.parent(family.facts.statement_of(node)) is method.body
    )


def _assigned_value(family: "InstanceFamily", write: cst.Attribute) -> Optional[cst.BaseExpression]:
    statement = family.facts.statement_of(write)
    small = only_assignment(statement)
    if small is not None and len(small.targets) == 1 and small.targets[0].target is write:
        return small.value
    return None


def _guarded_by_none_test(family: "InstanceFamily", write: cst.Attribute) -> bool:
    """``write`` is the only statement of ``if <same reference> is None:`` (no ``else``)."""
    facts = family.facts
    statement = facts.statement_of(write)
    block = facts.parent(statement)
    guard = facts.parent(block) if block is not None else None
    if not isinstance(guard, cst.If) or guard.orelse is not None or _assigned_value(family, write) is None:
        return False
    body = list(getattr(block, "body", ()))
    test = guard.test
    return (
        body == [statement]
        and isinstance(test, cst.Comparison)
        and len(test.comparisons) == 1
        and isinstance(test.comparisons[0].operator, cst.Is)
        and m.matches(test.comparisons[0].comparator, m.Name("None"))
        and code(test.left) == code(write)
    )
