"""The model a trainer's ``__init__`` builds its optimizer on, under its attribute's name.

``self.model = model`` and ``self.opt = Adam(model.parameters())`` in one ``__init__``: the
optimizer trains the object the attribute holds (issue 10, shape 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .attributes import InstanceFamily
from .plan import Binding
from .syntax import only_assignment

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["constructor_alias"]


def constructor_alias(rules: "TorchAmpRules", optimizer: Binding, model: str) -> Optional[str]:
    """``"self.model"`` when ``optimizer`` (an instance attribute's binding) is built in
    ``__init__`` on ``model``, a parameter of that ``__init__`` bound nowhere else, and one
    line of the same ``__init__`` is ``self.model = model``: the attribute holds the object
    the optimizer is built on (``self.model = model``; ``self.opt = Adam(model.parameters())``);
    else None."""
    family, statement = optimizer.scope, optimizer.statement
    if not isinstance(family, InstanceFamily) or statement is None or "." in model:
        return None
    method = family.method_of(statement)
    scope = rules.facts.scope(statement)
    if method is None or method.name.value != "__init__" or scope is None:
        return None
    bound = [a.node for a in scope[model] if isinstance(a, Assignment)]
    if len(bound) != 1 or not isinstance(bound[0], cst.Param) or bound[0] not in method.params.params:
        return None
    targets = [
        small.targets[0].target
        for line in method.body.body
        if (small := only_assignment(line)) is not None
        and len(small.targets) == 1
        and m.matches(small.value, m.Name(model))
        and m.matches(small.targets[0].target, m.Attribute(value=m.Name(family.methods[method])))
    ]
    if len(targets) != 1:
        return None
    return rules.attributes.reference(targets[0])
