"""What an optimizer factory of the module does besides building the optimizer (issue 10, shape 8).

``optimizer = build_optimizer(cfg, model)`` is migrated by handing the factory the wrapped
module and moving the optimizer it returns onto RoundPipe's copies
(:mod:`migrate.optimizer_helpers`). That is sound only for a factory that builds and
returns a torch optimizer and does nothing else to the training objects: one that also
steps, zeroes or back-propagates, wraps the model (DDP, ``torch.compile``), or returns
another object (a ``Lookahead`` or a class of the module holding the optimizer) would train
outside RoundPipe's step or hand ``adopt_optimizer`` something it cannot map. The class may
be chosen at run time (``if name == "adamw": return AdamW(...)``, a variable holding the
class): RoundPipe's ``adopt_optimizer`` checks at run time that every parameter it is given is
the module's. A factory of another file or a library is not seen here; the same run-time check
guards it.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst
from libcst.metadata import Assignment

from .names import ModuleFacts
from .parallel import other_trainer, parallel_call
from .syntax import code

__all__ = ["factory_blocker"]

#: methods that train (or zero) what the factory builds: not a factory's business
_TRAINING_METHODS = {"step", "backward", "zero_grad"}
_MAX_DEPTH = 3


def factory_blocker(facts: ModuleFacts, call: cst.Call, depth: int = 0) -> Optional[str]:
    """Why the function of this module that ``call`` calls is no plain optimizer factory
    (a sentence naming the statement), or None: not a function of this module, or one
    whose every ``return`` gives a torch optimizer (or a class chosen at run time) and whose
    body neither trains nor wraps."""
    function = facts.local_function(call)
    if function is None or depth > _MAX_DEPTH:
        return None
    name = function.name.value
    for inner in facts.subtree(function.body, cst.Call):
        func = inner.func
        if isinstance(func, cst.Attribute) and func.attr.value in _TRAINING_METHODS:
            return f"{name}() also calls `{code(inner)}`: a factory that trains is not migrated"
        if parallel_call(facts, inner, depth=_MAX_DEPTH) is not None or other_trainer(facts, inner) is not None:
            return f"{name}() also wraps the model (`{code(inner)}`): it would train outside RoundPipe"
    returns = [
        r for r in facts.subtree(function.body, cst.Return) if facts.enclosing(r, (cst.FunctionDef,)) is function
    ]
    if not returns:
        return f"{name}() returns no optimizer"
    for returned in returns:
        why = _not_an_optimizer(facts, returned.value, depth)
        if why is not None:
            return f"{name}() {why}"
    return None


def _not_an_optimizer(facts: ModuleFacts, value: Optional[cst.BaseExpression], depth: int) -> Optional[str]:
    """Why ``value`` (a returned expression) may be something else than a torch optimizer."""
    if isinstance(value, cst.Name):
        scope = facts.scope(value)
        bound = [a.node for a in scope[value.value] if isinstance(a, Assignment)] if scope is not None else []
        values = [_assigned(facts, node) for node in bound]
        if not values or any(v is None for v in values):
            return f"returns `{value.value}`, which is not bound by a plain assignment there"
        for assigned in values:
            why = _not_an_optimizer(facts, assigned, depth)
            if why is not None:
                return why
        return None
    if not isinstance(value, cst.Call):
        return f"returns `{code(value) if value is not None else 'None'}`, not an optimizer"
    if facts.local_function(value) is not None:
        inner = factory_blocker(facts, value, depth + 1)
        return f"returns what {inner}" if inner is not None else None
    names = facts.qualified(value.func)
    if isinstance(value.func, cst.Name) and all("<locals>" in n for n in names) and names:
        if _optimizer_classes(facts, value.func, depth):  # `opt_cls = getattr(torch.optim, name)`
            return None
        return f"calls `{value.func.value}`, which is not bound to torch optimizer classes only"
    if _local_class(facts, value) or (names and not any(n.startswith("torch.optim.") for n in names)):
        return f"returns `{code(value.func)}(...)`, not a torch optimizer"
    if any(n.startswith("torch.optim.lr_scheduler") for n in names):
        return f"returns `{code(value.func)}(...)`, a scheduler"
    return None


def _optimizer_classes(facts: ModuleFacts, variable: cst.Name, depth: int) -> bool:
    """``variable`` (a local of the factory) is bound only by plain assignments whose values
    name ``torch.optim`` and nothing imported from elsewhere (``getattr(torch.optim, name)``,
    ``{"adamw": AdamW, "sgd": SGD}[name]``, ``AdamW if adam else SGD``), other locals followed
    the same way."""
    scope = facts.scope(variable)
    bound = [a.node for a in scope[variable.value] if isinstance(a, Assignment)] if scope is not None else []
    values = [_assigned(facts, node) for node in bound]
    if not values or depth > _MAX_DEPTH:
        return False
    for value in values:
        if value is None:
            return False
        seen = [(n, facts.qualified(n)) for n in facts.subtree(value, (cst.Name, cst.Attribute))]
        named = {q for _, found in seen for q in found}
        if not any(q == "torch.optim" or q.startswith("torch.optim.") for q in named):
            return False
        for node, found in seen:
            for q in found:
                if "<locals>" in q and isinstance(node, cst.Name) and node is not variable:
                    if not _optimizer_classes(facts, node, depth + 1) and not _is_parameter(facts, node):
                        return False
                elif not (q == "torch" or q.startswith(("torch.", "builtins.")) or "<locals>" in q):
                    return False
    return True


def _is_parameter(facts: ModuleFacts, name: cst.Name) -> bool:
    scope = facts.scope(name)
    return scope is not None and any(isinstance(getattr(a, "node", None), cst.Param) for a in scope[name.value])


def _assigned(facts: ModuleFacts, node: object) -> Optional[cst.BaseExpression]:
    """The value a name is bound to by ``node`` when that is a one-target assignment."""
    statement = facts.statement_of(node) if isinstance(node, cst.Name) else None
    small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
    if isinstance(small, cst.Assign) and len(small.targets) == 1 and small.targets[0].target is node:
        return small.value
    return None


def _local_class(facts: ModuleFacts, call: cst.Call) -> bool:
    """``call`` builds a class of this module (a wrapper holding the optimizer)."""
    scope = facts.scope(call)
    if not isinstance(call.func, cst.Name) or scope is None:
        return False
    return any(isinstance(getattr(a, "node", None), cst.ClassDef) for a in scope[call.func.value])
