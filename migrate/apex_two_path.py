"""The apex two-path split: ``amp.scale_loss`` in one branch of an ``if``, a plain backward
in the other, one optimizer step shared after the ``if`` (NVIDIA's Tacotron2, WaveGlow,
BERT and Megatron-era scripts; examples in :mod:`migrate.rules.apex_two_path`).

The step is recognised from the ``if`` rather than from the ``scale_loss`` block: its
optimizer statements follow the ``if`` in the enclosing block. It takes the autograd form,
whichever path runs: the forward and the loss code stay, each branch keeps its backward as
written (the apex one through the RoundPipe model's ``scale_loss`` block), and the shared
optimizer work moves into one ``model.step(_step_fn)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst
import libcst.matchers as m

from .plain_path import PLAIN_BACKWARD
from .plan import Blocked
from .syntax import code, names_in, only_assignment, only_expression, statements_of

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = [
    "SplitBackward",
    "anchor_at_split",
    "is_overflow_test",
    "plan_disabled_initialize",
    "refuse_fused",
    "split_backward",
]


class SplitBackward:
    """The ``if`` whose branches back-propagate (``statement``) and the plain backward line."""

    def __init__(self, statement: cst.If, plain: cst.SimpleStatementLine) -> None:
        self.statement = statement
        self.plain = plain


def _only_statement(block: cst.BaseSuite) -> Optional[cst.BaseStatement]:
    body = statements_of(block)
    return body[0] if len(body) == 1 else None


def split_backward(step: "StepBuilder") -> Optional[SplitBackward]:
    """The split around ``step``'s backward (apex's ``scale_loss`` block, or torch's
    ``scaler.scale(loss).backward()``, :mod:`migrate.torch_two_path`): it is the only
    statement of one branch of an ``if``/``else`` (no ``elif``) whose other branch is only
    ``loss.backward()`` of the same loss; None for any other shape."""
    owner = step.facts.parent(step.block)
    statement = step.facts.parent(owner) if isinstance(owner, cst.Else) else owner
    if not isinstance(statement, cst.If) or not isinstance(statement.orelse, cst.Else):
        return None
    if len(step.body) != 1:
        return None
    other = statement.orelse.body if statement.body is step.block else statement.body
    plain = _only_statement(other)
    call = only_expression(plain) if plain is not None else None
    if not (isinstance(plain, cst.SimpleStatementLine) and call is not None and m.matches(call, PLAIN_BACKWARD)):
        return None
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)  # PLAIN_BACKWARD
    if not call.func.value.deep_equals(step.loss):
        return None
    return SplitBackward(statement, plain)


def anchor_at_split(step: "StepBuilder", split: SplitBackward) -> None:
    """Make the ``if`` of ``split`` the statement the step's code is found around: its
    forward before it, its optimizer statements after it, in the enclosing block."""
    block = step.facts.parent(split.statement)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)):
        raise Blocked(split.statement, "RPM130", "the two-path backward `if` is not a statement of a block")
    step.block = block
    step.body = list(block.body)
    step.index = step.body.index(split.statement)
    step.rules.plan.backward_statements.add(split.plain)


def refuse_fused(step: "StepBuilder", split: SplitBackward) -> None:
    """The fused form would move one path's backward into ``forward_backward`` and drop the
    ``if``: raise the unfusable reason that gives the step the autograd form."""
    raise Blocked(
        step.backward,
        "RPM107",
        f"the plain backward on line {step.facts.line(split.plain)} shares this step (two-path split)",
    )


#: ``math.isnan(norm)``, ``math.isinf(norm)``, ``not math.isfinite(norm)``: the overflow test
#: on a measured gradient norm (Tacotron2's ``is_overflow = math.isnan(grad_norm)``).
_OVERFLOW_TEST = m.OneOf(
    m.Call(func=m.Attribute(value=m.Name("math"), attr=m.Name("isnan") | m.Name("isinf")), args=[m.Arg(m.Name())]),
    m.UnaryOperation(
        operator=m.Not(), expression=m.Call(func=m.Attribute(value=m.Name("math"), attr=m.Name("isfinite")))
    ),
)


def is_overflow_test(statement: cst.BaseStatement) -> bool:
    """``name = math.isnan(norm)`` (or ``isinf``, ``not math.isfinite``): a value measured
    from the step's gradient norm, which moves with the clip that measured it."""
    assign = only_assignment(statement)
    return (
        assign is not None
        and len(assign.targets) == 1
        and isinstance(assign.targets[0].target, cst.Name)
        and m.matches(assign.value, _OVERFLOW_TEST)
    )


def plan_disabled_initialize(step: "StepBuilder", split: SplitBackward, model: str) -> None:
    """Where ``amp.initialize`` of ``model`` runs only under ``if C:`` (Tacotron2, BERT:
    apex is set up for fp16 runs alone), the plain path would step a model RoundPipe never
    wrapped: add ``else: <same targets> = roundpipe.compat.initialize(<models>, <optimizers>,
    enabled=False)`` (apex's ``enabled=False`` returns them unchanged; compat's wraps them
    without casting and installs disabled scalers). ``C`` must be the split's own condition
    and the ``if`` have no ``else``; raises :class:`Blocked` (RPM136) otherwise."""
    function = step.facts.enclosing(split.statement, (cst.FunctionDef,))
    for call in step.facts.subtree(function or step.facts.module, (cst.Call,)):
        if not step.facts.calls_any(call, {"apex.amp.initialize"}):
            continue
        line = step.facts.statement_of(call)
        assign = line.body[0] if isinstance(line, cst.SimpleStatementLine) else None
        if not isinstance(assign, cst.Assign) or model not in names_in(assign.targets[0].target):
            continue
        guard = step.facts.enclosing(line, (cst.If, cst.FunctionDef))
        if not isinstance(guard, cst.If):
            return  # set up on both paths
        if guard.orelse is not None or not guard.test.deep_equals(split.statement.test):
            raise Blocked(
                line,
                "RPM136",
                f"amp.initialize of `{model}` runs only under `if {code(guard.test)}:`, not the "
                f"condition of the two-path backward (`if {code(split.statement.test)}:`): the "
                "plain path would step a model RoundPipe never wrapped",
            )
        positional = [a for a in call.args if a.keyword is None][:2]
        arguments = ", ".join(code(a.value) for a in positional)
        disabled = cst.parse_statement(
            f"{code(assign.targets[0].target)} = roundpipe.compat.initialize({arguments}, enabled=False)\n"
        )
        orelse = cst.Else(body=cst.IndentedBlock(body=[disabled]))
        step.rules.plan.edits.replace_expression(guard, lambda updated: updated.with_changes(orelse=orelse))
        step.rules.plan.rewrites.append(
            (guard, "apex set up only for fp16 runs: the plain path's model is wrapped with enabled=False")
        )
        return
    _refuse_set_up_elsewhere_under_a_condition(step)


def _refuse_set_up_elsewhere_under_a_condition(step: "StepBuilder") -> None:
    """The step's model is set up outside its function (a setup helper, ``self``): raise
    :class:`Blocked` (RPM136) when any ``amp.initialize`` of the module runs under an ``if``,
    as the plain path may then step a model RoundPipe never wrapped."""
    for call in step.facts.subtree(step.facts.module, (cst.Call,)):
        if not step.facts.calls_any(call, {"apex.amp.initialize"}):
            continue
        guard = step.facts.enclosing(call, (cst.If, cst.FunctionDef))
        if isinstance(guard, cst.If):
            raise Blocked(
                call,
                "RPM136",
                f"amp.initialize runs only under `if {code(guard.test)}:`, away from the two-path "
                f"backward on line {step.facts.line(step.backward)}: the plain path may step a model "
                "RoundPipe never wrapped",
            )
