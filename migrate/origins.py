"""Where an object a training step uses was built: every binding that reaches a name.

A name bound in its own scope has one origin, that binding. A function parameter has the
origins of what each same-file call site passes: a name is followed further, a call
expression written in the argument (``train(model, create_optimizer(model, cfg))``) is an
origin itself. So a training function called for two models (each with its own optimizer)
has two origins for its optimizer parameter, and each is wrapped where it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List

import libcst as cst

from .names import argument_for
from .plan import Binding, Blocked

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["origins", "INLINE"]

#: the name of an origin that is a call written in an argument: it binds no name
INLINE = ""

_MAX_DEPTH = 4


def origins(rules: "TorchAmpRules", name: str, at: cst.CSTNode, depth: int = 0) -> List[Binding]:
    """The bindings that can reach ``name`` at ``at``, each once, in call-site order.

    Raises :class:`Blocked` (RPM108) when a parameter cannot be followed: its function is not
    called in this file, too deep, or a call site passes something else than a name or a
    call expression on a line of its own statement."""
    facts = rules.facts
    binding = rules._binding(name, at)
    if binding.statement is not None:
        return [binding]
    function = facts.function_of(binding.scope)  # type: ignore[arg-type]
    if function is None or depth > _MAX_DEPTH:
        raise Blocked(at, "RPM108", f"cannot follow {name!r} to where it is built")
    sites = facts.call_sites(function)
    if not sites:
        raise Blocked(
            function,
            "RPM108",
            f"{function.name.value}() is not called in this file; its model/optimizer cannot be followed",
        )
    found: List[Binding] = []
    for site in sites:
        value = argument_for(site, function, name)
        if isinstance(value, cst.Name):
            reached = origins(rules, value.value, site, depth + 1)
        elif isinstance(value, cst.Call) and isinstance(facts.statement_of(site), cst.SimpleStatementLine):
            reached = [Binding(facts.scope(site), INLINE, facts.statement_of(site), value)]  # type: ignore[arg-type]
        else:
            raise Blocked(site, "RPM108", f"{name!r} is not passed as a plain name or a call")
        for origin in reached:
            if not any(origin.statement is f.statement and origin.value is f.value for f in found):
                found.append(origin)
    return found
