"""Data-parallel scripts run on one process (issue 10, shape 10).

The widespread shape (torchvision's and DeiT's reference scripts)::

    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        model_without_ddp = model.module
    optimizer = torch.optim.AdamW(model_without_ddp.parameters(), ...)

keeps its single-process path: the guard's body becomes a ``raise RuntimeError`` saying that
RoundPipe places the model on the machine's devices itself (so the multi-process branch stops
with a clear error instead of training twice), the model is wrapped before the optimizer,
and the alias is bound again to the RoundPipe model, so ``model_without_ddp.state_dict()``
checkpoints keep the module's keys (the checkpoint rule rewrites them like the model's).

Accumulation steps that enter ``model.no_sync()`` when distributed and ``nullcontext()``
when not (``with ctx:``, ``ctx = model.no_sync() if ... else nullcontext()``) are
recognised: the optimizer step after that ``with`` block belongs to the backward inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Set

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .edits import carry_comments
from .names import PARALLEL_WRAPPERS
from .plan import Binding, Plan
from .syntax import only_assignment

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .steps import StepBuilder

__all__ = ["DdpGuard", "find_ddp_guard", "plan_ddp_guard", "is_sync_context", "stop_guard"]

_NULLCONTEXT = {"contextlib.nullcontext"}

_STOP = "roundpipe-migrate: RoundPipe places the model itself; run this program as one process"


@dataclass(frozen=True)
class DdpGuard:
    """``if cond: model = DDP(model, ...); alias = model.module``: the ``if``, the wrapped
    name, and the name the optimizer is built on (the model or a plain alias of it)."""

    statement: cst.If
    model: str
    owner: str


def find_ddp_guard(facts: "ModuleFacts", built: Binding, owner: str) -> Optional[DdpGuard]:
    """The DDP guard of the optimizer statement ``built``'s block: before it, when the
    optimizer is built on ``owner``'s parameters and ``owner`` is the guarded model or an
    alias bound to it (``owner = model``) before the guard; after it, wrapping ``owner``
    itself; else None."""
    statement = built.statement
    block = facts.parent(statement) if statement is not None else None
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return None
    body = list(block.body)
    index = body.index(statement)  # type: ignore[arg-type]
    for position in range(index - 1, -1, -1):
        guard = body[position]
        model = _guarded_model(facts, guard)
        if model is None:
            continue
        if owner == model or any(_plain_alias(s, owner, model) for s in body[:position]):
            return DdpGuard(guard, model, owner)  # type: ignore[arg-type]
        return None
    for guard in body[index + 1 :]:  # the wrap after the optimizer is built (timm's order)
        if _guarded_model(facts, guard) == owner:
            return DdpGuard(guard, owner, owner)  # type: ignore[arg-type]
    return None


def _guarded_model(facts: "ModuleFacts", statement: cst.BaseStatement) -> Optional[str]:
    """``model`` for ``if ...: model = DDP(model, ...)`` (no else), whose body only wraps the
    model and binds aliases ``x = model.module``; else None."""
    if not isinstance(statement, cst.If) or statement.orelse is not None:
        return None
    if not isinstance(statement.body, cst.IndentedBlock):
        return None
    wrapped: Set[str] = set()
    for inner in statement.body.body:
        small = only_assignment(inner)
        if small is None or len(small.targets) != 1:
            return None
        target, value = small.targets[0].target, small.value
        if not isinstance(target, cst.Name):
            return None
        if (
            isinstance(value, cst.Call)
            and facts.calls_any(value, PARALLEL_WRAPPERS)
            and value.args
            and m.matches(value.args[0].value, m.Name(target.value))
        ):
            wrapped.add(target.value)
        elif not (
            m.matches(value, m.Attribute(value=m.Name(), attr=m.Name("module"))) and value.value.value in wrapped  # type: ignore[attr-defined]
        ):
            return None
    return wrapped.pop() if len(wrapped) == 1 else None


def _plain_alias(statement: cst.BaseStatement, alias: str, model: str) -> bool:
    return m.matches(
        statement,
        m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name(alias))], value=m.Name(model))]),
    )


def plan_ddp_guard(step: "StepBuilder", built: Binding, guard: DdpGuard) -> None:
    """The guard's body becomes the stop (its comments kept); after the wrap of
    ``guard.model`` before the optimizer, an alias the optimizer is built on is bound to
    the RoundPipe model again and followed like it."""
    plan = step.rules.plan
    stop_guard(plan, guard.statement, _STOP)
    plan.rewrites.append(
        (guard.statement, f"DistributedDataParallel branch stops with a clear error (RoundPipe places {guard.model})")
    )
    if guard.owner == guard.model:
        return
    block = step.facts.parent(built.statement)
    assert isinstance(block, (cst.IndentedBlock, cst.Module)) and built.statement is not None  # find_ddp_guard's
    index = list(block.body).index(built.statement)
    plan.edits.insert_before(block, index, [cst.parse_statement(f"{guard.owner} = {guard.model}\n")])
    plan.wrapped_models.append((built.scope, guard.owner, step.facts.order(built.statement)))


def stop_guard(plan: Plan, guard: cst.If, message: str) -> None:
    """Make the body of the DDP branch ``guard`` (an ``if`` without ``else`` and an indented
    body) ``raise RuntimeError("<message>")``, its comments kept; the model rules then skip
    what was there (it never runs). The one way a DDP branch becomes a stop (torch.amp's
    guards here, apex's DDP line in :mod:`migrate.apex_extras`)."""
    body = guard.body
    assert isinstance(body, cst.IndentedBlock)
    stop = cst.parse_statement(f'raise RuntimeError("{message}")\n')

    def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        return [carry_comments(updated, stop)]

    plan.edits.replace_range(body, 0, len(body.body), build)
    plan.stopped_guards.append(guard)


def is_sync_context(facts: "ModuleFacts", statement: Optional[cst.CSTNode]) -> bool:
    """A ``with`` whose every item is ``x.no_sync()``, ``nullcontext()``, a conditional choice
    of those, or a name bound to one of them before the ``with``."""
    if not isinstance(statement, cst.With):
        return False
    return all(_sync_expression(facts, item.item, statement) for item in statement.items)


def _sync_expression(facts: "ModuleFacts", node: cst.BaseExpression, at: cst.CSTNode, depth: int = 0) -> bool:
    if isinstance(node, cst.IfExp):
        return _sync_expression(facts, node.body, at, depth) and _sync_expression(facts, node.orelse, at, depth)
    if isinstance(node, cst.Call):
        if m.matches(node, m.Call(func=m.Attribute(attr=m.Name("no_sync")), args=[])):
            return True
        return facts.calls_any(node, _NULLCONTEXT) and not node.args
    if isinstance(node, cst.Name) and depth == 0:
        scope = facts.scope(at)
        assignments = [a for a in (scope[node.value] if scope is not None else []) if isinstance(a, Assignment)]
        values = []
        for assignment in assignments:
            line = facts.statement_of(assignment.node)
            small = only_assignment(line)
            values.append(small.value if small is not None and len(small.targets) == 1 else None)
        return bool(values) and all(v is not None and _sync_expression(facts, v, at, depth + 1) for v in values)
    return False


def aliased_models(facts: "ModuleFacts", built: Binding, owner: str) -> Set[str]:
    """The names ``owner`` is bound to in ``built``'s scope (``owner = model``, ``owner =
    model.module``): a DDP wrap of one of them trains what the optimizer steps too."""
    found: Set[str] = set()
    for node in facts.assignments(owner, built.scope):  # type: ignore[arg-type]
        line = facts.statement_of(node)
        small = only_assignment(line)
        value = small.value if small is not None else None
        if isinstance(value, cst.Attribute) and value.attr.value == "module":
            value = value.value
        if isinstance(value, cst.Name) and value.value != owner:
            found.add(value.value)
    return found
