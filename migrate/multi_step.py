"""Several optimizer steps in one program: GANs and other multi-network trainers.

A GAN iteration steps a discriminator, then a generator, each with its own optimizer and
backward, and one scaler shared by both (``scaler.step(opt_d)`` after the first backward,
``scaler.step(opt_g)`` and the one ``scaler.update()`` after the second) or one scaler each.
:class:`~migrate.steps.StepBuilder` plans each step on its own; this module holds what
changes when another backward shares the program:

* :func:`check_fusable` keeps every such step in the autograd form: a backward may reach
  another network's parameters (the generator's loss runs through the discriminator), so
  forwards and backwards stay on the main thread as written.
* :func:`keeps_zero_grad_in_place` says a ``zero_grad()`` before the backward stays where
  it is (on the model, whose gradients the other backward may have filled in between)
  instead of moving to the end of the step function; the step function also zeroes the
  optimizer copies (:func:`migrate.rules.step_function.plan_step_group`).
* :func:`own_statements` ends a step group before a statement working on another network
  (``scaler.step(opt_d)`` then ``net_g.zero_grad()``): that one stays on the main thread.
* :func:`require_update_later` accepts a step group without ``scaler.update()`` only when the
  same scaler's update follows later in the same block, so the scale is still updated
  once per iteration, after every step that shares it.

roundpipe's GradScaler records each optimizer's inf checks in the iteration's record and
``update()`` combines them as torch does, also with the steps queued asynchronously on
the one optimizer thread (docs/gradscaler.md).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, List, Optional, Set

import libcst as cst
import libcst.matchers as m

from .gradient_helpers import why_not_moved
from .plan import Blocked
from .reached_models import zeroed_in_place_key
from .recognised import RecognisedStep, StepGroup
from .syntax import code, exclusive, names_in, only_expression
from .two_path import other_branch

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = [
    "check_fusable",
    "feeds_later_backward",
    "keeps_zero_grad_in_place",
    "own_statements",
    "require_update_later",
    "schedules",
    "unsupported_group",
    "several_models_message",
    "zero_models_in_place",
]

_OPTIMIZER_WORK = frozenset({"unscale", "clip", "guarded", "step"})  # what must stay in one step function


def other_backward(step: "StepBuilder") -> Optional[cst.Call]:
    """The first ``.backward(...)`` of the module, outside this step's backward statement,
    that can run in the same program as it (not in the other branch of an ``if`` around
    both, as the plain path of a two-path step is); None when there is none."""
    facts = step.facts
    for call in facts.backward_calls:
        if facts.within(call, step.backward) or exclusive(facts, call, step.backward):
            continue
        return call
    return None


def feeds_later_backward(step: "StepBuilder") -> bool:
    """The next statement of the block that uses the scaler after this backward is another
    ``scaler.scale(loss).backward()`` of the same scaler (DCGAN's discriminator: one backward
    on the real batch, one on the fakes, then one step): this backward only accumulates
    gradients for the step after that one, and stays as written (autograd form). Planned:
    nothing but the report line; the later backward's step is planned on its own."""

    if not step.autograd_form or other_branch(step):
        return False
    later = next((s for s in step.body[step.index + 1 :] if step.anchor in names_in(s)), None)
    scaled_backward = m.Call(
        func=m.Attribute(
            value=m.Call(func=m.Attribute(value=m.Name(step.scaler), attr=m.Name("scale"))), attr=m.Name("backward")
        )
    )
    if later is None or not m.matches(only_expression(later) or cst.Pass(), scaled_backward):
        return False
    step.rules.plan.rewrites.append(
        (
            step.backward,
            "autograd form: backward kept; its gradients are stepped with those of the next "
            f"backward (line {step.facts.line(later)})",
        )
    )
    return True


def check_fusable(step: "StepBuilder") -> None:
    """Raise the reason (an unfusable code, see :data:`migrate.steps.UNFUSABLE`) why a step
    sharing its program with another backward keeps the autograd form."""
    if not step.autograd_form:
        return  # only the fused form exists for this kind of step (apex)
    backward = only_expression(step.backward)
    if isinstance(backward, cst.Call) and backward.args:  # retain_graph=...: see _plan_backward
        raise Blocked(
            step.backward,
            "RPM133",
            "the backward keeps its graph (retain_graph) for a later backward; it stays as written",
        )
    other = other_backward(step)
    if other is not None:
        line = step.facts.line(other)
        raise Blocked(
            step.backward,
            "RPM107",
            f"another backward (line {line}) shares the program and may reach this "
            "model's parameters (several networks or optimizers)",
        )


def keeps_zero_grad_in_place(step: "StepBuilder") -> bool:
    """A ``zero_grad()`` before this step's backward stays where it is: another backward may
    fill the model's gradients between this step and that point (the generator's backward
    through the discriminator), and the original drops them there."""
    return step.autograd_form and other_backward(step) is not None


def own_statements(step: "StepBuilder", recognised: RecognisedStep) -> RecognisedStep:
    """``recognised`` with its group up to the first statement that zeroes another network or
    steps a scheduler built on another optimizer: what follows stays on the main thread, in
    its place."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    for position, statement in enumerate(found.statements):
        if not _foreign(step, statement, optimizer, model):
            continue
        rest = found.statements[position:]
        if any(step.classify(s) in _OPTIMIZER_WORK for s in rest):
            raise Blocked(
                statement,
                "RPM107",
                f"this statement works on another network in the middle of the step of "
                f"{optimizer!r}; the step cannot move into one step function; not migrated",
            )
        kept = found.statements[:position]
        return replace(
            recognised, group=StepGroup(found.block, found.start, found.start + position, kept, found.condition)
        )
    return recognised


def _foreign(step: "StepBuilder", statement: cst.BaseStatement, optimizer: str, model: str) -> bool:
    kind = step.classify(statement)
    owner = _owner(statement)
    if kind == "zero_grad":
        return owner not in (optimizer, model)
    if kind == "scheduler" and owner is not None:
        return not schedules(step, owner, statement, optimizer)
    return False


def _owner(statement: cst.BaseStatement) -> Optional[str]:
    """``x`` (or ``self.x``, as written) of a line ``x.method(...)``."""
    call = only_expression(statement)
    if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute):
        return code(call.func.value)
    return None


def schedules(step: "StepBuilder", scheduler: str, at: cst.CSTNode, optimizer: str) -> bool:
    """``scheduler`` (a name seen at ``at``) may drive ``optimizer``: False only when it is
    built by a call whose first argument names another optimizer
    (``StepLR(opt_g, ...)`` does not schedule ``opt_d``)."""
    if not scheduler.isidentifier():
        return True
    try:
        built = step.rules.binding(scheduler, at).value
    except Blocked:
        return True
    if isinstance(built, cst.Call) and built.args and isinstance(built.args[0].value, cst.Name):
        return built.args[0].value.value == optimizer
    return True


def require_update_later(step: "StepBuilder", group: List[cst.BaseStatement], optimizer: str) -> None:
    """A step group without ``scaler.update()`` (the first of several steps sharing one
    scaler) needs that scaler's update as a later statement of the same block (or of the
    block around the ``if`` holding the group); otherwise the scale would not be updated
    once per iteration after it, and the step is refused."""
    facts = step.facts
    anchor: cst.BaseStatement = group[-1]
    block = facts.parent(anchor)
    while isinstance(block, (cst.IndentedBlock, cst.Module)):
        body = list(block.body)
        for statement in body[body.index(anchor) + 1 :]:
            call = only_expression(statement)
            if (
                _owner(statement) == step.scaler
                and call is not None
                and m.matches(call, m.Call(func=m.Attribute(attr=m.Name("update"))))
            ):
                return
        guard = facts.parent(block)
        if not isinstance(guard, cst.If) or guard.orelse is not None:
            break
        anchor, block = guard, facts.parent(guard)
    raise Blocked(
        group[0],
        "RPM107",
        f"`{step.scaler}.step({optimizer})` is not followed by `{step.scaler}.update()`, "
        "neither in its step nor later in the same block (one under a condition does not "
        "count): the scale must be updated once per iteration after every step that "
        "shares it; not migrated",
    )


def zero_models_in_place(step: "StepBuilder", recognised: RecognisedStep, zero_grads: List[int]) -> None:
    """The ``zero_grad()`` calls at these positions of the step's block stay where they are,
    on the ``recognised`` step's model: ``optimizer.zero_grad(...)`` becomes
    ``model.zero_grad(...)`` (the optimizer is built on that model's parameters, whose
    gradients RoundPipe's backward fills); the step function zeroes the optimizer copies
    after the step. A call on anything else is refused: left as it was, it would no longer
    zero the model."""
    optimizer, model = recognised.optimizer, recognised.model
    if zero_grads:
        step.rules.plan.zeroed_in_place.add(zeroed_in_place_key(step.facts, step.backward, model))
    for index in zero_grads:
        statement = step.body[index]
        owner = _owner(statement)
        if owner == model:
            continue
        call = only_expression(statement)
        if owner != optimizer or not isinstance(call, cst.Call):
            raise Blocked(
                statement, "RPM107", f"a zero_grad() of {owner!r} before the step of {optimizer!r}; not migrated"
            )
        step.rules.plan.edits.replace_expression(
            call.func.value,  # type: ignore[attr-defined]
            lambda _: cst.parse_expression(model),
        )


def several_models_message(optimizer: str, models: Set[str]) -> str:
    """Why an optimizer over the parameters of several models is refused (RPM108)."""
    names = " and ".join(sorted(models))
    return (
        f"optimizer {optimizer!r} trains the parameters of several models ({names}): each "
        "RoundPipe model steps its own optimizer copies, so one optimizer cannot span two "
        "wrapped models; build one optimizer per model (or one module holding both) by hand"
    )


def unsupported_group(step: "StepBuilder", group: List[cst.BaseStatement], kinds: List[Optional[str]]) -> Blocked:
    """The refusal for a step group without exactly one ``scaler.step()`` (RPM107 for
    several, RPM106 for none), or with several ``scaler.update()`` calls (RPM134), naming
    what the group holds or where it stopped."""
    reason_code = "RPM107"
    if kinds.count("step") > 1:
        why = (
            "several optimizers are stepped after one backward "
            f"({kinds.count('step')} `{step.scaler}.step()` calls); one RoundPipe step "
            "function serves one model's optimizer; not migrated"
        )
    elif kinds.count("update") > 1:
        reason_code = "RPM134"
        why = f"`{step.scaler}.update()` is called {kinds.count('update')} times in one step; not migrated"
    else:
        reason_code = "RPM106"
        block = step.facts.parent(group[-1])
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        position = body.index(group[-1]) + 1 if group[-1] in body else len(body)
        stop = body[position] if position < len(body) else None
        helper = why_not_moved(step, stop) if stop is not None else None
        if helper is not None:  # a project helper doing more than gradient work
            return helper
        where = f" (they stop at line {step.facts.line(stop)}: `{code(stop).strip().splitlines()[0]}`)" if stop else ""
        why = (
            f"no `{step.scaler}.step(optimizer)` among the optimizer statements after the backward{where}; not migrated"
        )
    return Blocked(group[0], reason_code, why)
