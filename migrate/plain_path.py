"""The plain (non-AMP) path of a two-path training step.

Real scripts often train with or without AMP behind one flag: ``if scaler is not None:``
(or ``if args.amp:``) around the AMP step, ``else: loss.backward(); optimizer.step()``
(examples in :mod:`migrate.rules.two_path_amp`).

Once the AMP path is migrated the model is wrapped, so the plain path must train through
RoundPipe too (its ``optimizer.step()`` would otherwise step copies that never receive a
gradient). It takes the autograd form: the backward stays as written, and the optimizer
statements after it (clipping, ``optimizer.step()``, ``zero_grad``, scheduler steps) move
into a step function for ``model.step``. Both branches must step unconditionally, so a
``zero_grad()`` before or after the ``if`` still sees each iteration's gradients consumed
(in the asynchronous form it waits for the running step first, as every main-thread write
of optimizer state does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Type

import libcst as cst
import libcst.matchers as m

from .plan import Blocked
from .recognised import RecognisedStep, StepGroup
from .rules import step_function
from .rules.model_zero_grad import zero_models_beside
from .rules.optimizer_writes import order_optimizer_writes
from .same_condition import same_condition
from .steps import StepBuilder
from .syntax import method_call, only_expression
from .two_path import other_branch

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["PLAIN_BACKWARD", "PlainStepBuilder", "plan_plain_path"]

#: ``loss.backward()``: the backward of a plain path.
PLAIN_BACKWARD = m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("backward")), args=[])


class PlainStepBuilder(StepBuilder):
    """``loss.backward()`` + ``optimizer.step()`` in the other branch of a migrated step,
    for the optimizer and the model that step trains."""

    autograd_form = True
    step_rewrite = "plain (non-AMP) optimizer step -> model.step(step_fn)"

    def __init__(
        self, rules: "TorchAmpRules", backward: cst.SimpleStatementLine, loss: cst.BaseExpression, amp_step: StepBuilder
    ) -> None:
        super().__init__(rules, amp_step.scaler, backward, loss)
        self.optimizer, self.model = amp_step.trained
        self.anchor = self.optimizer
        self.built, self.model_outer = amp_step.built, amp_step.model_outer
        self.amp_step = amp_step

    def classify(self, statement: cst.BaseStatement) -> Optional[str]:
        value = only_expression(statement)
        if isinstance(value, cst.Call) and not value.args and method_call(value, self.optimizer, "step"):
            return "step"
        kind = super().classify(statement)
        return kind if kind in ("clip", "zero_grad", "scheduler") else None

    def plan(self) -> None:
        found = step_function.find_step_group(self)
        kinds = [self.classify(s) for s in found.statements]
        zero_grads = [p for p in range(self.index) if self.zero_grad_call(self.body[p], self.optimizer, self.model)]
        if kinds.count("step") != 1 or not (found.block is self.block or self._steps_as_amp(found, zero_grads)):
            raise Blocked(
                found.statements[0],
                "RPM136",
                "the plain (non-AMP) path does not call "
                f"{self.optimizer}.step() once after its backward, unconditionally or under the "
                "condition of the AMP path's step",
            )
        recognised = RecognisedStep(found, self.optimizer, self.model)
        step_function.plan_step_group(self, recognised, zero_grads)
        self.rules.plan.rewrites.append(
            (self.backward, "autograd form for the plain (non-AMP) path: its forward, loss code and backward are kept")
        )
        zero_models_beside(self, recognised, {*found.statements, self.backward})
        if not self.rules.exact:
            order_optimizer_writes(self, recognised, {*found.statements, self.backward})

    def _steps_as_amp(self, found: StepGroup, zero_grads: List[int]) -> bool:
        """The plain step sits under the same condition as the AMP step beside it
        (:func:`migrate.same_condition.same_condition`), with no ``zero_grad()`` before its
        backward (that one would move under the condition)."""
        amp = self.amp_step
        if found.condition is None or zero_grads or not isinstance(amp, StepBuilder):
            return False  # a loss-scaler wrapper's step (`_WrapperStep`) has no group condition
        return same_condition(found.condition, self.body, self.index, amp.group_condition, amp.body, amp.index)

    def step_body(self, updated, kinds, optimizer: str):
        return list(updated), None


def plan_plain_path(
    amp_step: StepBuilder, backward: m.Call = PLAIN_BACKWARD, builder: Type[PlainStepBuilder] = PlainStepBuilder
) -> bool:
    """If ``amp_step`` is one branch of an ``if``/``else`` whose other branch trains with a
    plain backward (a statement matching ``backward``), migrate that branch's step as well,
    with ``builder``; True when there is such a branch. Raises :class:`Blocked` (RPM136)
    when that branch runs several backwards, or does not step as :class:`PlainStepBuilder`
    requires."""
    backwards = [s for s in other_branch(amp_step) if m.matches(only_expression(s) or cst.Pass(), backward)]
    if not backwards:
        return False
    if len(backwards) != 1:
        raise Blocked(
            backwards[1], "RPM136", "the plain (non-AMP) branch beside a migrated AMP step runs several backwards"
        )
    call = only_expression(backwards[0])
    assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
    builder(amp_step.rules, backwards[0], call.func.value, amp_step).plan()  # type: ignore[arg-type]
    return True
