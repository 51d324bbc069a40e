"""Rule model_zero_grad: a main-thread ``optimizer.zero_grad()`` also clears the model's gradients.

In RoundPipe form the optimizer works on copies of the model's parameters
(:mod:`roundpipe.optimizer_copies`): a backward fills the model's gradients, ``model.step``
hands them to the copies. An ``optimizer.zero_grad()`` that stays on the main thread,
outside the step function (before an epoch's loop, under an accumulation ``if`` after a
loss-scaler wrapper's call), clears only the copies; a gradient left pending on the model
(accumulated, no step yet: the short last accumulation of an epoch) would be added to the
next step instead of dropped as in the original. :func:`zero_models_beside` (a recognised
step) and :func:`plan_model_zeroing` (a loss-scaler wrapper's call) find such calls of the
step's optimizer wherever it is used on the main thread (the step's function, its callers,
a trainer's methods: :func:`migrate.rules.optimizer_writes.write_places`);
:func:`emit_model_zeroing` adds ``model.zero_grad(<same arguments>)`` right after each one
still on the main thread once every step is planned. The ``optimizer.zero_grad()`` itself
stays: the copies keep a gradient the step function does not clear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Set

import libcst as cst

from ..names import ModuleFacts
from ..plan import Blocked, Plan
from ..syntax import code, method_call, only_expression
from . import Example, Pattern, Rule
from .optimizer_writes import write_places

if TYPE_CHECKING:
    from ..recognised import RecognisedStep
    from ..steps import StepBuilder

__all__ = ["RULE", "emit_model_zeroing", "plan_model_zeroing", "zero_models_beside"]

RULE = Rule(
    name="model_zero_grad",
    order=81,
    description="a main-thread `optimizer.zero_grad()` outside the step function also clears the model's gradients",
    codes=("RPM108",),
    implemented_in=("rules/model_zero_grad.py",),
    patterns=(
        Pattern(
            "`optimizer.zero_grad(...)` of a migrated optimizer left on the main thread, outside the step function: before an epoch's loop (timm/DeiT/MAE `train_one_epoch`), under an accumulation `if` after a loss-scaler wrapper's call, in a caller of the step's function or a trainer method",
            "kept, with `model.zero_grad(...)` (same arguments) right after it: a gradient accumulated on the model with no step yet is dropped there as in the original, not added to the next step; refused (RPM108) where the optimizer's model has no name there",
            "迁移后的优化器留在主线程、步骤函数之外的 `optimizer.zero_grad(...)`：在一个 epoch 的循环之前（timm/DeiT/MAE 的 `train_one_epoch`）、在损失缩放器包装调用之后的累积 `if` 中、在步骤函数的调用方或训练器方法中",
            "保留，并在其后紧接 `model.zero_grad(...)`（参数相同）：模型上已累积但尚未步进的梯度像原脚本一样在此被丢弃，而不会加到下一步；在该处优化器的模型没有名字时拒绝（RPM108）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train_one_epoch(model, optimizer, scaler, data, accum):\n    optimizer.zero_grad()\n    for i, (x, y) in enumerate(data):\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss / accum).backward()\n        if (i + 1) % accum != 0:\n            continue\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n\n\ndef main(data):\n    model = torch.nn.Linear(4, 4)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    train_one_epoch(model, optimizer, scaler, data, 3)\n',
            expect=("    optimizer.zero_grad()\n    model.zero_grad()\n    for i, (x, y) in enumerate(data):",),
        ),
        Example(
            'import torch\n\n\ndef train(model, data):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    optimizer.zero_grad(set_to_none=False)\n    model.zero_grad(set_to_none=False)  # already clears the model: nothing added\n    for x, y in data:\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "    optimizer.zero_grad(set_to_none=False)\n"
                "    model.zero_grad(set_to_none=False)  # already clears the model: nothing added\n"
                "    for x, y in data:",
            ),
        ),
        Example(
            "import torch\n\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "optimizer.zero_grad()  # no GradScaler step: the optimizer's parameters are the model's\n",
        ),
    ),
)


def zero_models_beside(step: "StepBuilder", recognised: "RecognisedStep", skipped: Set[cst.CSTNode]) -> None:
    """Plan the model's ``zero_grad()`` after every main-thread ``zero_grad()`` of the
    ``recognised`` step's optimizer wherever it is used (not under the ``skipped``
    statements, the step's own). Nothing for a step whose shape leaves its optimizer's
    main-thread uses to another rule (``step.orders_optimizer_writes``: a loss-scaler
    wrapper's plain path, :func:`plan_model_zeroing` at the wrapper's call)."""
    if not step.orders_optimizer_writes:
        return
    places, _ = write_places(step, recognised)
    for place in places:
        plan_model_zeroing(
            step.rules.plan, step.facts, place.root, place.optimizer, place.model, skipped, not step.rules.exact
        )


def plan_model_zeroing(
    plan: Plan,
    facts: ModuleFacts,
    root: cst.CSTNode,
    optimizer: str,
    model: Optional[str],
    skipped: Set[cst.CSTNode],
    wait: bool,
) -> None:
    """Record every ``<optimizer>.zero_grad(...)`` call under ``root`` (not inside nested
    functions or classes, nor under ``skipped``) for :func:`emit_model_zeroing`, to clear
    ``model``'s gradients after it; with ``wait`` (the asynchronous form, where no other
    rule orders these calls) it also waits for the running step first (``model.synchronize()`` before it: it clears the copies
    that step works on; a pre-loop call runs after the previous epoch's last step).
    :class:`Blocked` (RPM108) for such a call when the model has no name there (``model``
    None)."""

    def visit(node: cst.CSTNode) -> bool:
        if node in skipped or (node is not root and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
            return False
        if isinstance(node, cst.Call) and method_call(node, optimizer, "zero_grad"):
            if model is None:
                raise Blocked(
                    node,
                    "RPM108",
                    f"`{code(node)}` clears only the optimizer copies' gradients in RoundPipe form, and "
                    "the model has no name here to clear its own (`model.zero_grad()`); migrate it by hand",
                )
            plan.zero_models_after.append((node, model))
            if wait:
                plan.synchronize_before.append((facts.statement_of(node), model))
        return True

    facts.walk(root, visit)


def emit_model_zeroing(facts: ModuleFacts, plan: Plan) -> None:
    """``model.zero_grad(<same arguments>)`` right after each recorded ``optimizer.zero_grad(...)``
    still on the main thread (not moved into a step function), unless a ``zero_grad()`` of
    that model is already next to it. :class:`Blocked` (RPM108) for a call that is not a
    whole statement of a block (nowhere to put the model's)."""
    done: Set[int] = set()
    for call, model in plan.zero_models_after:
        statement = facts.statement_of(call)
        if statement in plan.step_statements or any(a in plan.step_statements for a in facts.ancestors(call)):
            continue
        if id(call) in done:
            continue
        done.add(id(call))
        block = facts.parent(statement)
        if only_expression(statement) is not call or not isinstance(block, (cst.IndentedBlock, cst.Module)):
            raise Blocked(
                call,
                "RPM108",
                f"`{code(call)}` clears only the optimizer copies' gradients in RoundPipe form; it is not a "
                f"statement of its own, so `{model}.zero_grad()` cannot follow it; put it on its own line",
            )
        body = list(block.body)
        index = body.index(statement)
        neighbours = [only_expression(s) for s in body[max(index - 1, 0) : index + 2] if s is not statement]
        if any(n is not None and method_call(n, model, "zero_grad") for n in neighbours):
            continue
        arguments = ", ".join(code(a).rstrip(", ") for a in call.args)
        plan.edits.insert_before(block, index + 1, [cst.parse_statement(f"{model}.zero_grad({arguments})\n")])
        plan.rewrites.append(
            (statement, f"{model}.zero_grad() after it: the optimizer's zero_grad() clears only its copies")
        )
