"""A GradScaler handed to a trainer's constructor, or built there when none is.

Real trainers take an optional scaler (``Trainer(model, args, scaler=None)``) and build one
when the caller passes none::

    if scaler is None:
        scaler = GradScaler(enabled=args.fp16)
    self.scaler = scaler
    # or: self.scaler = scaler if scaler is not None else GradScaler(...)
    # or: self.scaler = scaler or GradScaler(...)

``self.scaler`` then holds either the class's own scaler or the caller's. Both become
RoundPipe scalers only if every caller is seen: :func:`injected_attribute` accepts the
binding when every construction of the class in the module passes nothing, ``None``, or a
name bound to a torch GradScaler construction of the module (which the rules follow and
rewrite too), and the parameter is otherwise only replaced by GradScaler constructions.
Anything else (a construction the module does not show, a scaler from elsewhere) is
refused with RPM120 naming the construction or the binding.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional, Tuple

import libcst as cst
import libcst.matchers as m

from .attributes import InstanceFamily
from .handed_in import note_handed
from .inherited_init import handed_arguments
from .plan import Blocked
from .syntax import code, only_assignment

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["injected_attribute", "torch_scaler"]

_CODE = "RPM120"

#: Whether an expression builds the kind of scaler asked about.
Builds = Callable[["TorchAmpRules", cst.BaseExpression], bool]


def torch_scaler(rules: "TorchAmpRules", value: cst.BaseExpression) -> bool:
    """``value`` is a torch GradScaler construction (any spelling)."""
    try:
        return isinstance(value, cst.Call) and rules.facts.scaler_kind(value) is not None
    except ValueError:
        return False


def injected_attribute(
    rules: "TorchAmpRules", assign: cst.Assign, builds: Builds = torch_scaler
) -> Optional[Tuple[InstanceFamily, str]]:
    """(the family, the attribute) that ``assign`` (``self.scaler = scaler``, possibly
    with a fallback) binds in ``__init__`` when every scaler it can hold is one that
    ``builds`` accepts, built in this module (by default a torch GradScaler, which the
    rules follow and rewrite); None when ``assign`` is not of that shape (the caller
    refuses as before); :class:`Blocked` when a caller may hand in another scaler."""
    facts = rules.facts
    target = assign.targets[0].target if len(assign.targets) == 1 else None
    family = rules.attributes.family_of_attribute(target) if isinstance(target, cst.Attribute) else None
    init = family.method_of(assign) if family is not None else None
    parameter = _handed_parameter(assign.value, init)
    if family is None or init is None or init.name.value != "__init__" or parameter is None:
        return None
    assert isinstance(target, cst.Attribute)
    fallback = _fallback(assign.value, parameter)
    if fallback is not None and not builds(rules, fallback):
        return None
    statement = facts.statement_of(assign)
    scope = facts.scope(parameter)
    for binding in scope[parameter.value] if scope is not None else ():
        node = getattr(binding, "node", None)
        if isinstance(node, cst.Param) or _builds_scaler(rules, node, builds):
            continue
        raise Blocked(
            node if isinstance(node, cst.CSTNode) else assign,
            _CODE,
            f"`{parameter.value}` (the scaler stored in {code(target)}) is bound in __init__ to something "
            "that is not a GradScaler; left untouched",
        )
    try:
        handed = handed_arguments(facts, family, init, parameter.value)
    except Blocked as blocked:
        raise Blocked(
            statement,
            _CODE,
            f"`{code(statement).strip()}` may keep a scaler handed in by a caller the migration does not "
            f"see ({blocked.message}); build every {family.name} in the files given, or migrate by hand",
        ) from None
    for site, passed in handed:
        if passed is None or m.matches(passed, m.Name("None")) or _names_scaler(rules, passed, site, builds):
            continue
        raise Blocked(
            site,
            _CODE,
            f"`{code(site)}` hands {family.name} `{code(passed)}` as its scaler, which the migration cannot "
            "follow to a torch GradScaler built in this file; left untouched",
        )
    note_handed(rules.plan, family, statement, init, f"{code(target)}: every scaler")
    return family, target.attr.value


def _handed_parameter(value: cst.BaseExpression, init: Optional[cst.FunctionDef]) -> Optional[cst.Name]:
    """The parameter of ``init`` in ``scaler``, ``scaler if scaler is not None else X``,
    ``X if scaler is None else scaler`` or ``scaler or X``."""
    if init is None:
        return None
    names = {p.name.value for p in init.params.params[1:]}
    candidates = [value]
    if isinstance(value, cst.IfExp):
        candidates = [value.body, value.orelse]
    elif isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
        candidates = [value.left]
    found = [c for c in candidates if isinstance(c, cst.Name) and c.value in names]
    return found[0] if len(found) == 1 else None


def _fallback(value: cst.BaseExpression, parameter: cst.Name) -> Optional[cst.BaseExpression]:
    """The other side of ``scaler if scaler is not None else X`` / ``scaler or X``."""
    if isinstance(value, cst.IfExp):
        return value.orelse if value.body is parameter else value.body
    if isinstance(value, cst.BooleanOperation):
        return value.right
    return None


def _builds_scaler(rules: "TorchAmpRules", node: object, builds: Builds) -> bool:
    """``node`` binds the name to a scaler construction (``scaler = GradScaler()``)."""
    if not isinstance(node, cst.CSTNode):
        return False
    statement = rules.facts.statement_of(node)
    small = only_assignment(statement)
    return small is not None and builds(rules, small.value)


def _names_scaler(rules: "TorchAmpRules", passed: cst.BaseExpression, site: cst.Call, builds: Builds) -> bool:
    """``passed`` is a scaler construction, or a name bound to one."""
    if builds(rules, passed):
        return True
    if not isinstance(passed, cst.Name):
        return False
    try:
        binding = rules.binding(passed.value, site)
    except Blocked:
        return False
    value = binding.value
    if isinstance(value, cst.IfExp) and m.matches(value.orelse, m.Name("None")):
        value = value.body  # `GradScaler(...) if amp else None`
    return binding.statement is not None and value is not None and builds(rules, value)
