"""Checkpoint helpers of another file of the project that only save or load state.

``save_checkpoint(path, model, optimizer, scaler)`` defined in ``checkpointing.py`` and
called from the training script: the migration of the script does not see the helper's
body, so the project layer (:mod:`migrate.project`) reads it with Python's parser and tells
the engine which of its parameters are *state-only*: every use of the parameter in the
helper is ``p.state_dict()``, ``p.load_state_dict(...)`` or a presence test (``p is None``,
``p is not None``, ``if p``). Handing such a helper the RoundPipe scaler needs no change
(its state dict has torch's keys); handing it the wrapped model becomes
``model.synchronize()`` before the call and ``model.model`` as the argument, so the
checkpoint keeps the module's keys and the newest weights, and a load refreshes the
optimizer copies (RoundPipe hooks the wrapped module's ``load_state_dict``).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Dict, FrozenSet, Mapping, Optional, Tuple

import libcst as cst

from .syntax import code

__all__ = ["StateHelper", "StateHelpers", "find_state_helpers", "state_only_parameter"]

_STATE_METHODS = frozenset({"state_dict", "load_state_dict"})


@dataclass(frozen=True)
class StateHelper:
    """A function's parameters in order and those that are state-only."""

    params: Tuple[str, ...]
    state_only: FrozenSet[str]


#: callee as a call site writes it (``save_checkpoint``, ``ckpt.save_checkpoint``) -> helper
StateHelpers = Mapping[str, StateHelper]


def find_state_helpers(tree: ast.Module) -> Dict[str, StateHelper]:
    """The module-level functions of ``tree`` with at least one state-only parameter."""
    found: Dict[str, StateHelper] = {}
    for node in tree.body:
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        arguments = node.args
        if arguments.vararg or arguments.kwarg:
            continue
        params = tuple(a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs])
        state_only = frozenset(p for p in params if _only_state_uses(node, p))
        if state_only:
            found[node.name] = StateHelper(params, state_only)
    return found


def _only_state_uses(function: ast.AST, name: str) -> bool:
    parents: Dict[ast.AST, ast.AST] = {}
    uses = 0
    for parent in ast.walk(function):
        for child in ast.iter_child_nodes(parent):
            parents[child] = parent
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                return False  # a nested scope could capture or rebind it: not followed
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name:
            if not isinstance(node.ctx, ast.Load) or not _state_use(node, parents):
                return False
            uses += 1
    return uses > 0


def _state_use(node: ast.Name, parents: Dict[ast.AST, ast.AST]) -> bool:
    parent = parents.get(node)
    if isinstance(parent, ast.Attribute) and parent.attr in _STATE_METHODS:
        call = parents.get(parent)
        return isinstance(call, ast.Call) and call.func is parent
    if isinstance(parent, ast.Compare):
        return (
            parent.left is node
            and len(parent.ops) == 1
            and isinstance(parent.ops[0], (ast.Is, ast.IsNot))
            and isinstance(parent.comparators[0], ast.Constant)
            and parent.comparators[0].value is None
        )
    child: ast.AST = node
    if isinstance(parent, ast.UnaryOp) and isinstance(parent.op, ast.Not):
        child, parent = parent, parents.get(parent)
    if isinstance(parent, ast.BoolOp):  # `if scaler and "scaler" in checkpoint:`
        child, parent = parent, parents.get(parent)
    return isinstance(parent, (ast.If, ast.IfExp, ast.While)) and parent.test is child


def state_only_parameter(helpers: StateHelpers, call: cst.Call, arg: cst.Arg) -> Optional[str]:
    """The state-only parameter of a helper that ``arg`` of ``call`` feeds, else None."""
    helper = helpers.get(code(call.func)) if isinstance(call.func, (cst.Name, cst.Attribute)) else None
    if helper is None or arg.star:
        return None
    if arg.keyword is not None:
        param: Optional[str] = arg.keyword.value
    else:
        index = list(call.args).index(arg)
        if any(a.star for a in call.args[:index]) or index >= len(helper.params):
            return None
        param = helper.params[index]
    return param if param in helper.state_only else None
