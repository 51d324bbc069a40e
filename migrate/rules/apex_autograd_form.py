"""Rule apex_autograd_form: an apex step whose forward cannot move into a loss function keeps
its forward and loss code; its ``amp.scale_loss`` block becomes the RoundPipe model's block.

:func:`plan_apex_autograd_form` plans it for an :class:`~migrate.apex_amp.ApexStepBuilder`
(``step``) whose fused form was refused for one of the reasons in
:data:`migrate.steps.UNFUSABLE`: the step's optimizer work moves into ``model.step`` as in
the torch.amp autograd form (:mod:`migrate.rules.autograd_form`), and
``amp.scale_loss(loss, optimizer[, loss_id=k])`` becomes ``model.scale_loss(loss,
scaler)`` with the loss's compat scaler (:meth:`roundpipe.compat.model.AmpRoundPipe.scale_loss`:
the same exit as the fused form's ``forward_backward``: unscale onto the copies, overflow
check, scale update, skipped step). The block's body, ``scaled.backward()``, stays.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import libcst as cst

from ..plan import Blocked
from ..recognised import RecognisedStep
from . import Example, Pattern, Rule
from .autograd_form import plan_autograd_form

if TYPE_CHECKING:
    from ..apex_amp import ApexStepBuilder

__all__ = ["RULE", "plan_apex_autograd_form"]

_NAN_GUARD = """import math

import torch
from apex import amp


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", num_losses=2)
    for step, (x, y) in enumerate(batches):
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not math.isfinite(loss.item()):  # a NaN guard
            continue
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer, loss_id=1) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
"""

_HELD_LOSS_DICT = """import torch
from apex import amp


class Trainer:
    def __init__(self, model, lr):
        self.model = model
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr)
        self.model, self.optimizer = amp.initialize(self.model, self.optimizer, opt_level="O1")

    def train_step(self, x, y):
        out = self.model(x)
        losses = {"mse": torch.nn.functional.mse_loss(out, y), "l1": torch.nn.functional.l1_loss(out, y)}
        loss = sum(losses.values())
        print({name: value.item() for name, value in losses.items()})
        with amp.scale_loss(loss, self.optimizer) as scaled_loss:
            scaled_loss.backward()
        torch.nn.utils.clip_grad_norm_(amp.master_params(self.optimizer), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        return loss.item()
"""

_FP16_OPTIMIZER = """import math

import torch
from apex.fp16_utils import FP16_Optimizer


def train(model, batches):
    model = model.half()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    optimizer = FP16_Optimizer(optimizer, dynamic_loss_scale=True)
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not math.isfinite(loss.item()):
            raise FloatingPointError("loss is not finite")
        optimizer.zero_grad()
        optimizer.backward(loss)
        optimizer.step()
"""

_MIGRATED = """import math

import roundpipe
import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O2")
    amp_scaler = roundpipe.compat.loss_scaler()
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        if not math.isfinite(loss.item()):
            continue
        with model.scale_loss(loss, amp_scaler) as scaled_loss:
            scaled_loss.backward()

        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
"""

RULE = Rule(
    name="apex_autograd_form",
    order=46,
    description="an apex step whose forward cannot move into a loss function keeps its forward and "
    "loss code; amp.scale_loss becomes the RoundPipe model's scale_loss block; only the optimizer "
    "work moves into model.step",
    codes=("RPM131",),
    implemented_in=("rules/apex_autograd_form.py", "apex_amp.py"),
    patterns=(
        Pattern(
            "apex: work between the forward and `with amp.scale_loss(loss, optimizer[, loss_id=k]) as scaled: scaled.backward()` that needs the loss on the main thread (a NaN/inf guard that raises or skips, `loss.item()` logged, loss dicts summed, an `if` that rescales the loss), the model called several times for one loss",
            "autograd form: the forward and the loss code stay as written; the block becomes `with model.scale_loss(loss, amp_scaler) as scaled: scaled.backward()` (the loss's compat scaler; the same exit as the fused form: unscale onto the optimizer copies, overflow check, scale update, skipped step); only the optimizer work moves into `_step_fn`; refused (RPM131) for `FP16_Optimizer`'s `optimizer.backward(loss)` and with `--apex-target plain`",
            "apex：前向与 `with amp.scale_loss(loss, optimizer[, loss_id=k]) as scaled: scaled.backward()` 之间需要在主线程上使用损失的代码（发现 NaN/inf 时抛出异常或跳过、记录 `loss.item()`、对损失字典求和、按条件缩放损失的 `if`），或一个损失由多次模型调用算出",
            "autograd 形式：前向和损失代码保持原样；该块变为 `with model.scale_loss(loss, amp_scaler) as scaled: scaled.backward()`（该损失的 compat scaler；块退出时的处理与融合形式相同：unscale 到优化器副本、溢出检查、更新缩放、跳过步骤）；只有优化器相关的工作移入 `_step_fn`；`FP16_Optimizer` 的 `optimizer.backward(loss)` 以及 `--apex-target plain` 下拒绝迁移（RPM131）",
        ),
    ),
    examples=(
        Example(
            _NAN_GUARD,
            expect=(
                "        if not math.isfinite(loss.item()):  # a NaN guard\n            continue\n"
                "        with model.scale_loss(loss, roundpipe.compat.loss_scaler(1)) as scaled_loss:\n"
                "            scaled_loss.backward()\n\n        def _step_fn():\n"
                "            roundpipe.compat.loss_scaler(1).step(optimizer)\n            optimizer.zero_grad()\n\n"
                "        model.step(_step_fn)\n        roundpipe.compat.loss_scaler(1).update()\n",
            ),
        ),
        Example(
            _HELD_LOSS_DICT,
            expect=(
                "        with self.model.scale_loss(loss, amp_scaler) as scaled_loss:\n"
                "            scaled_loss.backward()\n\n        def _step_fn():\n"
                "            amp_scaler.unscale_(self.optimizer)\n",
            ),
        ),
        Example(
            _NAN_GUARD.replace(", num_losses=2", "").replace(", loss_id=1", ""), codes=("RPM131",), apex_target="plain"
        ),
        Example(_FP16_OPTIMIZER, codes=("RPM131",)),
        Example(_MIGRATED),
    ),
)


def plan_apex_autograd_form(step: "ApexStepBuilder", recognised: RecognisedStep, unfused: Blocked) -> None:
    """RoundPipe's autograd form for an apex step (module docstring); raises ``unfused``
    where the step has only the fused form (``step.autograd_form`` False:
    ``FP16_Optimizer``'s ``optimizer.backward(loss)``, the plain target)."""
    block = step.backward
    if not (step.autograd_form and isinstance(block, cst.With)):
        raise unfused
    call = block.items[0].item
    assert isinstance(call, cst.Call) and call.args  # amp.scale_loss(loss, optimizer, ...) (_check_scale_loss)
    plan_autograd_form(step, recognised, unfused)
    model, scaler = recognised.model, step.scaler
    for statement in step.body[: step.index]:  # the forward calls: the step's own uses of the model
        step.rules.step_model_calls.update(step.model_calls(statement, model))

    def model_block(updated: cst.Call) -> cst.Call:
        loss = updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        func = cst.parse_expression(f"{model}.scale_loss")
        return updated.with_changes(func=func, args=(loss, cst.Arg(cst.parse_expression(scaler))))

    step.rules.plan.edits.replace_expression(call, model_block)
