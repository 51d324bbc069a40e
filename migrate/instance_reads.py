"""Uses of a trainer instance's step state from outside its class, in the class's own file.

A trainer class that steps ``self.model`` asynchronously leaves the step running when its
method returns. Code of the same file holding an instance (``trainer.train_step(x, y)``,
then ``trainer.scheduler.get_last_lr()``) that reads or writes what the step works on (the
scheduler the step function steps, anything built from the optimizer or the model) would
race with it; such a use waits for the step first, through the instance's own model
(``trainer.model.synchronize()`` before its statement). Which attributes hold that state is
:func:`migrate.instance_state.step_state_attributes` (the rule a file reading them through
an instance in another file is refused by). The model and the optimizer attributes are not
among the uses found here: the model's reads have their own rules
(:mod:`migrate.model_uses`), and the optimizer attribute is followed by
:class:`~migrate.attributes.InstanceFamily` (which refuses its uses from outside).
"""

from __future__ import annotations

import ast
import textwrap
from typing import List, Set, Tuple

import libcst as cst

from .attributes import InstanceFamily
from .instance_state import step_state_attributes
from .syntax import code

__all__ = ["outside_state_uses"]


def outside_state_uses(family: InstanceFamily, optimizer: str, model: str) -> List[Tuple[cst.CSTNode, str]]:
    """(statement, ``<instance>.<model attribute>``) for every use, outside the ``family``'s
    methods, of an attribute holding its step's state (other than the ``optimizer`` and the
    ``model``, both read as ``self.<attribute>`` in the step's method) through a name that
    may hold an instance: the statement to wait for the step before, and the instance's
    model to wait on."""
    model_attribute = model.partition(".")[2]
    optimizer_attribute = optimizer.partition(".")[2]
    if not model_attribute.isidentifier() or not optimizer_attribute.isidentifier():
        return []
    held: Set[str] = set()
    for cls in family.classes:
        parsed = ast.parse(textwrap.dedent(code(cls))).body[0]
        assert isinstance(parsed, ast.ClassDef)  # the text of a class statement
        held |= step_state_attributes(parsed, {model_attribute})
    found: List[Tuple[cst.CSTNode, str]] = []
    for attribute in sorted(held - {model_attribute, optimizer_attribute}):
        for use in family.outside_uses(attribute):
            if isinstance(use.value, cst.Name):
                found.append((family.facts.statement_of(use), f"{use.value.value}.{model_attribute}"))
    return found
