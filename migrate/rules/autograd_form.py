"""Rule autograd_form: a step whose forward cannot move into a loss function keeps its forward, loss code and backward; only the optimizer work moves into model.step.

:func:`plan_autograd_form` plans it for a :class:`~migrate.steps.StepBuilder` (``step``)
whose fused form was refused for one of the reasons in :data:`migrate.steps.UNFUSABLE`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..plan import Blocked
from ..recognised import RecognisedStep
from . import Example, Pattern, Rule
from .model_zero_grad import zero_models_beside
from .optimizer_writes import order_optimizer_writes
from .step_function import plan_step_group, require_every_iteration

if TYPE_CHECKING:
    from ..steps import StepBuilder

__all__ = ["RULE", "plan_autograd_form"]

_WORK_BETWEEN = """import math

import torch


def train(model, batches):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(batches):
        with torch.autocast("cuda"):
            losses = model(x, y)  # a dict of losses
        loss = sum(losses.values())
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()} at step {step}")
        if step < 10:
            loss = loss * (step + 1) / 10  # warm-up
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""

_MICRO_STEPS = """import contextlib

import torch


def train(model, get_batch, steps, micro_steps, amp, clip):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    ctx = torch.autocast("cuda") if amp else contextlib.nullcontext()
    for it in range(steps):
        for micro_step in range(micro_steps):
            x, y = get_batch()
            with ctx:
                loss = model(x, y) / micro_steps
            scaler.scale(loss).backward()
        if clip:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
"""

_ZEROED_EACH_MICRO_STEP = _MICRO_STEPS.replace(
    "            x, y = get_batch()\n", "            optimizer.zero_grad()\n            x, y = get_batch()\n"
)

_ALREADY_MIGRATED = """import roundpipe
import torch


def train(model, batches):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler("cuda")
    for x, y in batches:
        loss = torch.nn.functional.mse_loss(model(x), y)
        print(loss.item())
        scaler.scale(loss).backward()

        def step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(step_fn)
        scaler.update()
"""

_MIGRATED_HELPER = """import roundpipe
import torch


def run_step(model, optimizer, scaler, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()  # the scaler is a parameter: followed to its caller

    def step_fn():
        scaler.step(optimizer)
        optimizer.zero_grad()

    model.step(step_fn)
    scaler.update()


def main(model, batches):
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler("cuda") if torch.cuda.is_available() else None
    for x, y in batches:
        run_step(model, optimizer, scaler, x, y)
"""

_STEP_HELPERS = """import torch


def backward_step(loss, grad_scaler):
    grad_scaler.scale(loss).backward()


def optimizer_step(optimizer, grad_scaler, model):
    grad_scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    grad_scaler.step(optimizer)
    grad_scaler.update()
    optimizer.zero_grad()


def train(batches):
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in batches:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.mse_loss(model(x), y)
        backward_step(loss, scaler)
        optimizer_step(optimizer, scaler, model)
"""

#: the two helpers name their scaler parameter differently; the caller hands both the same scaler
_RENAMED_SCALER = _STEP_HELPERS.replace(
    "def backward_step(loss, grad_scaler):\n    grad_scaler.scale(loss).backward()\n",
    "def backward_step(loss, amp_scaler):\n    amp_scaler.scale(loss).backward()\n",
)

#: ... but hands the optimizer helper another scaler
_RENAMED_OTHER_SCALER = _RENAMED_SCALER.replace(
    '    scaler = torch.amp.GradScaler("cuda")\n',
    '    scaler = torch.amp.GradScaler("cuda")\n    step_scaler = torch.amp.GradScaler("cuda")\n',
).replace("optimizer_step(optimizer, scaler, model)", "optimizer_step(optimizer, step_scaler, model)")

RULE = Rule(
    name="autograd_form",
    order=45,
    description="a step whose forward cannot move into a loss function keeps its forward, loss code "
    "and backward; only the optimizer work moves into model.step",
    codes=("RPM133", "RPM135"),
    implemented_in=("rules/autograd_form.py", "split_functions.py", "split_step.py"),
    patterns=(
        Pattern(
            "the backward and the optimizer step in two functions handed the scaler (`backward_step(loss, scaler)` ending with `grad_scaler.scale(loss).backward()`, `optimizer_step(optimizer, scaler, model)`, the scaler parameters named alike or not with unscale/clip/step/update/zero_grad), in the same file or in files of the project that only this caller imports",
            "autograd form: `backward_step` stays as written; `optimizer_step`'s step group becomes `model.step(_step_fn)` + `grad_scaler.update()` (clipping on `model.optim_parameters()`), the model is wrapped and the optimizer built on `model.optim_parameters()` where the caller builds them; refused (RPM106/RPM107) when a call hands either function other objects, a function is used as a value, or a `zero_grad` runs outside the step function",
            "反向与优化器步骤位于两个接收 scaler 的函数中（`backward_step(loss, scaler)` 以 `grad_scaler.scale(loss).backward()` 结尾，`optimizer_step(optimizer, scaler, model)`（两者的 scaler 参数名可以不同）中做 unscale/裁剪/step/update/zero_grad），位于同一文件，或位于项目中只被这一个调用方导入的文件",
            "autograd 形式：`backward_step` 保持原样；`optimizer_step` 的步骤组变为 `model.step(_step_fn)` + `grad_scaler.update()`（裁剪改用 `model.optim_parameters()`），模型在调用方构建处包装，优化器改用 `model.optim_parameters()` 构建；若某个调用给两个函数传入其他对象、函数被当作值使用，或在步骤函数之外执行 `zero_grad`，则拒绝迁移（RPM106/RPM107）",
        ),
        Pattern(
            "work between the forward and the backward that needs the loss on the main thread (loss dicts summed, `loss.item()`, a NaN/inf check that raises, logging, an `if` that rescales the loss), a forward in a `with` that is not autocast (a context variable or helper), the model called several times",
            "autograd form: `out = model(x)`, the loss code and `scaler.scale(loss).backward()` stay as written (RoundPipe's forward is differentiable, the backward accumulates the gradients `model.step` hands to the optimizer copies); only the optimizer work moves into `_step_fn`; `zero_grad()` before the backward moves to the end of `_step_fn`; the report names the form and why the step was not fused",
            "前向与反向之间需要在主线程上使用损失的代码（对损失字典求和、`loss.item()`、发现 NaN/inf 时抛出异常、日志、按条件缩放损失的 `if`）、位于非 autocast 的 `with` 中的前向（上下文变量或辅助函数）、多次调用模型",
            "autograd 形式：`out = model(x)`、损失代码和 `scaler.scale(loss).backward()` 保持原样（RoundPipe 的前向可微，反向累积的梯度由 `model.step` 交给优化器副本）；只有优化器相关的工作移入 `_step_fn`；反向之前的 `zero_grad()` 移到 `_step_fn` 的末尾；报告会写明所用形式以及未融合的原因",
        ),
        Pattern(
            "a loop of micro-steps (`for micro_step in range(k): ... scaler.scale(loss).backward()`) with the step after it; `if clip: scaler.unscale_(opt); clip_grad_norm_(...)` in the step",
            "the step after the loop becomes `model.step(_step_fn)` + `scaler.update()`; the guarded unscale/clip moves into `_step_fn` as it is (clipping on `model.optim_parameters()`); a `zero_grad()` inside the micro-step loop refuses the step (RPM135)",
            "微步循环（`for micro_step in range(k): ... scaler.scale(loss).backward()`），循环之后执行优化器步骤；步骤中的 `if clip: scaler.unscale_(opt); clip_grad_norm_(...)`",
            "循环之后的步骤变为 `model.step(_step_fn)` + `scaler.update()`；带条件的 unscale/裁剪原样移入 `_step_fn`（裁剪改用 `model.optim_parameters()`）；微步循环内的 `zero_grad()` 会拒绝迁移该步骤（RPM135）",
        ),
    ),
    examples=(
        Example(
            _WORK_BETWEEN,
            expect=(
                "        if step < 10:\n            loss = loss * (step + 1) / 10  # warm-up\n"
                "        scaler.scale(loss).backward()\n\n        def _step_fn():\n"
                "            scaler.step(optimizer)\n            optimizer.zero_grad()\n\n"
                "        model.step(_step_fn)\n        scaler.update()\n",
                "optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)",
            ),
        ),
        Example(
            _MICRO_STEPS,
            expect=(
                "            scaler.scale(loss).backward()\n\n        def _step_fn():\n"
                "            if clip:\n                scaler.unscale_(optimizer)\n"
                "                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip)\n"
                "            scaler.step(optimizer)\n            optimizer.zero_grad(set_to_none=True)\n\n"
                "        model.step(_step_fn)\n        scaler.update()\n",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        if x is not None:\n            print(aux)\n        with torch.autocast("cuda"):\n            out = model(x)\n            aux = out.mean()\n            loss = torch.nn.functional.mse_loss(out, y) + aux\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "            aux = out.mean()\n            loss = torch.nn.functional.mse_loss(out, y) + aux\n"
                "        scaler.scale(loss).backward()\n\n        def _step_fn():\n",
            ),
        ),
        Example(
            _MICRO_STEPS.replace(
                "    for it in range(steps):\n", "    for it in range(steps):\n        optimizer.zero_grad()\n"
            ).replace("        optimizer.zero_grad(set_to_none=True)\n", ""),
            expect=(
                "        model.synchronize()\n        optimizer.zero_grad()\n        model.zero_grad()\n        for micro_step",
            ),
        ),
        Example(_ZEROED_EACH_MICRO_STEP, codes=("RPM135",)),
        Example(_ALREADY_MIGRATED),
        Example(_MIGRATED_HELPER),
        Example(
            _STEP_HELPERS,
            expect=(
                "def backward_step(loss, grad_scaler):\n    grad_scaler.scale(loss).backward()\n",
                "    def _step_fn():\n        grad_scaler.unscale_(optimizer)\n"
                "        torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n"
                "        grad_scaler.step(optimizer)\n        optimizer.zero_grad()\n\n"
                "    model.step(_step_fn)\n    grad_scaler.update()\n",
                "    model = roundpipe.RoundPipe(",
            ),
        ),
        Example(
            _STEP_HELPERS.replace(
                "        backward_step(loss, scaler)\n",
                "        backward_step(loss, scaler)\n        optimizer.zero_grad()\n",
            ),
            codes=("RPM106",),
        ),
        Example(
            _RENAMED_SCALER,
            expect=(
                "def backward_step(loss, amp_scaler):\n    amp_scaler.scale(loss).backward()\n",
                "        grad_scaler.step(optimizer)\n        optimizer.zero_grad()\n\n"
                "    model.step(_step_fn)\n    grad_scaler.update()\n",
                "    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())\n",
            ),
        ),
        Example(_RENAMED_OTHER_SCALER, codes=("RPM106",)),
    ),
)


def plan_autograd_form(step: "StepBuilder", recognised: RecognisedStep, unfused: Blocked) -> None:
    """RoundPipe's autograd form (design/MIGRATE.md, "Two target forms"): the forward,
    the loss code and ``scaler.scale(loss).backward()`` stay on the main thread as
    written (RoundPipe's forward is differentiable; the backward accumulates the
    gradients that ``model.step`` hands to the optimizer copies); only the optimizer
    work moves into the step function. ``unfused`` says why the fused form was refused."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    zero_grads = [p for p in range(step.index) if step.zero_grad_call(step.body[p], optimizer, model)]
    if zero_grads:
        require_every_iteration(step, step.body[zero_grads[0]], found)
    plan_step_group(step, recognised, zero_grads)
    step.rules.plan.rewrites.append(
        (
            step.backward,
            f"autograd form: forward, loss code and backward kept on the main thread (not fused: {unfused.message})",
        )
    )
    zero_models_beside(step, recognised, {*found.statements, step.backward})
    if not step.rules.exact:
        order_optimizer_writes(step, recognised, {*found.statements, step.backward})
