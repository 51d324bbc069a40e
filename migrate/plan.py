"""What the rules decide about a module, and how they say "not this one"."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Set, Tuple

import libcst as cst

from .edits import Edits

__all__ = ["Blocked", "Binding", "Plan"]


class Blocked(Exception):
    """A construct the rules do not fully understand: leave the file, report this."""

    def __init__(self, node: cst.CSTNode, code: str, message: str) -> None:
        super().__init__(message)
        self.node = node
        self.code = code
        self.message = message


class WritePlace(NamedTuple):
    """Where main-thread writes of an optimizer may race with its running step: code under
    ``root`` that reads the optimizer as ``optimizer`` (a name, ``self.opt``, a state field)
    and waits on the model read as ``model`` (None: it has no name for it); a write counts
    when it may run after one of ``anchors`` (None: any statement may, e.g. a method called
    at any time)."""

    root: cst.CSTNode
    optimizer: str
    model: Optional[str]
    anchors: Optional[List[cst.CSTNode]]


@dataclass
class Binding:
    """A name as seen from one scope: the node that bound it there (None: a parameter)."""

    scope: object
    name: str
    statement: Optional[cst.BaseStatement]
    value: Optional[cst.BaseExpression]


@dataclass
class Plan:
    """Everything the rules decided for one module."""

    edits: Edits = field(default_factory=Edits)
    rewrites: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    wrapped_optimizers: Set[int] = field(default_factory=set)
    wrapped_models: List[Tuple[object, str, int]] = field(default_factory=list)  # scope/family, name, after (order)
    handed_classes: Set[str] = field(default_factory=set)  # followed through their constructions (migrate.handed_in)
    helper_names: Set[str] = field(default_factory=set)
    backward_statements: Set[cst.CSTNode] = field(default_factory=set)  # of recognised steps
    step_statements: Set[cst.CSTNode] = field(default_factory=set)  # moved into step functions
    blocked: List["Blocked"] = field(default_factory=list)  # every blocker found, in finding order
    # (statement, model name): main-thread optimizer writes to order after the running step
    synchronize_before: List[Tuple[cst.CSTNode, str]] = field(default_factory=list)
    taken_names: Set[str] = field(default_factory=set)  # every name the module already uses
    stopped_guards: List[cst.If] = field(default_factory=list)  # DDP branches now raising (migrate.ddp_guard)
    microbatch: str = ""  # the generated microbatch-count constant (see :meth:`fresh`)
    trained_models: Dict[cst.CSTNode, str] = field(default_factory=dict)  # backward -> the model its step trains
    # models whose zero_grad() stays on the model before their backward (migrate.reached_models)
    zeroed_in_place: Set[Tuple[int, str]] = field(default_factory=set)
    # (optimizer.zero_grad() call, model name): main-thread zero_grads to follow with the model's
    zero_models_after: List[Tuple[cst.Call, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.microbatch:
            self.microbatch = self.fresh("NUM_MICROBATCH")

    def fresh(self, base: str) -> str:
        """A generated name that neither the module nor earlier generated code uses, so it
        never captures or shadows a user's name (``base``, else ``base_2``, ``base_3``...)."""
        used = self.taken_names | self.helper_names
        name, counter = base, 2
        while name in used:
            name = f"{base}_{counter}"
            counter += 1
        self.helper_names.add(name)
        return name
