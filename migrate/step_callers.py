"""The callers of a step's function, up the call chain, with their names for its optimizer and model.

A step function handed the optimizer (``def train_step(model, batch, optimizer, scaler)``)
returns while its asynchronous step still runs, so a caller that writes the optimizer
after the call (``scheduler.step()`` in ``fit``) races with it, and so does a caller of that
caller (``fit`` → ``run_epoch`` → ``train_step``). :func:`caller_places` follows the
same-file calls of the step's function (and of each caller the optimizer is handed on by)
and says, for each, what the caller calls the optimizer and the model there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from .method_calls import method_call_sites
from .names import argument_for
from .syntax import dotted

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .torch_amp import TorchAmpRules

__all__ = ["CallerPlace", "caller_places"]

_MAX_DEPTH = 4


@dataclass(frozen=True)
class CallerPlace:
    """A function (or the module) calling a function that runs the step: ``call`` hands it
    the optimizer as ``optimizer``; ``model`` is the caller's name for the step's model
    (None when the call hands it no plain name or attribute: the caller has no handle)."""

    root: cst.CSTNode
    optimizer: str
    model: Optional[str]
    call: cst.Call


def caller_places(
    rules: "TorchAmpRules", function: cst.FunctionDef, optimizer: str, model: str
) -> Tuple[List[CallerPlace], Set[str]]:
    """The places calling ``function`` (whose ``optimizer`` is one of its parameters) and,
    recursively, their callers that hand the optimizer on as a parameter, nearest first;
    with the names of the functions on the chain (calls of them run a step, they are not
    writes of the optimizer). A function with an optimizer it does not take as a parameter
    has no caller places."""
    places: List[CallerPlace] = []
    chain: Set[str] = set()
    frontier: List[Tuple[cst.FunctionDef, str, Optional[str]]] = [(function, optimizer, model)]
    seen: Set[int] = set()
    depth = 0
    while frontier and depth <= _MAX_DEPTH:
        reached: List[Tuple[cst.FunctionDef, str, Optional[str]]] = []
        for callee, optimizer_name, model_name in frontier:
            if id(callee) in seen or optimizer_name not in _parameters(callee):
                continue
            seen.add(id(callee))
            chain.add(callee.name.value)
            for place in _calls_of(rules, callee, optimizer_name, model_name):
                places.append(place)
                caller = rules.facts.enclosing(place.call, (cst.FunctionDef,))
                if isinstance(caller, cst.FunctionDef):  # without a model name: its callers' writes are refused
                    reached.append((caller, place.optimizer, place.model))
        frontier = reached
        depth += 1
    return places, chain


def _parameters(function: cst.FunctionDef) -> List[str]:
    return [p.name.value for p in function.params.params]


def _calls_of(
    rules: "TorchAmpRules", function: cst.FunctionDef, optimizer: str, model: Optional[str]
) -> List[CallerPlace]:
    """One place per call of ``function`` that hands the optimizer as a name or attribute
    (a call expression written in the argument cannot be written through by the caller)."""
    facts = rules.facts
    method_sites = method_call_sites(rules, function)
    sites = facts.call_sites(function) if method_sites is None else method_sites
    skipped = 0 if method_sites is None else 1
    receiver = function.params.params[0].name.value if method_sites is not None else None
    places = []
    for site in sites:
        handed = argument_for(site, function, optimizer, skipped)
        caller_optimizer = dotted(handed) if handed is not None else None
        if caller_optimizer is None:
            continue
        root = facts.enclosing(site, (cst.FunctionDef,)) or facts.module
        places.append(
            CallerPlace(root, caller_optimizer, _caller_model(facts, site, function, model, skipped, receiver), site)
        )
    return places


def _caller_model(
    facts: "ModuleFacts",
    site: cst.Call,
    function: cst.FunctionDef,
    model: Optional[str],
    skipped: int,
    receiver: Optional[str],
) -> Optional[str]:
    """What the caller at ``site`` calls ``function``'s ``model``: the name or attribute it
    passes for that parameter, ``trainer.model`` for ``self.model`` of a method called as
    ``trainer.train_step(...)``, the same name for a module-level model (bound by neither
    function); else None."""
    caller = facts.enclosing(site, (cst.FunctionDef,))
    if model is None:
        return None
    if model in _parameters(function)[skipped:]:
        handed = argument_for(site, function, model, skipped)
        return dotted(handed) if handed is not None else None
    head, _, rest = model.partition(".")
    if receiver is not None and head == receiver and rest:
        owner = dotted(site.func.value) if isinstance(site.func, cst.Attribute) else None
        return f"{owner}.{rest}" if owner is not None else None
    return (
        model if "." not in model and not _binds(facts, function, model) and not _binds(facts, caller, model) else None
    )


def _binds(facts: "ModuleFacts", function: Optional[cst.CSTNode], name: str) -> bool:
    """``function`` (None: the module level) binds ``name`` in its own scope, shadowing a
    module-level name."""
    if not isinstance(function, cst.FunctionDef) or not function.body.body:
        return False
    scope = facts.scope(function.body.body[0])
    return scope is None or name in scope.assignments
