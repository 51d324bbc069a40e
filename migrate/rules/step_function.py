"""Rule step_function: the optimizer statements move, in order, into a step function for model.step.

The rule finds the step group after the backward (:func:`find_step_group`, a frozen
:class:`~migrate.recognised.StepGroup`), moves the ``zero_grad()`` calls before the
backward to the step's end (:func:`zero_grads_to_move`) and emits ``_step_fn`` with
``model.step`` and the main-thread ``scaler.update()`` (:func:`plan_step_group`). It works for a
:class:`~migrate.steps.StepBuilder` (``step``): the recognised step, its shape hooks
(``classify``, ``step_body``, ``holds_model``, ``shape_edits``) and the shared context
``step.rules`` (bindings, the plan, options).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Tuple, Union

import libcst as cst
import libcst.matchers as m

from .. import gradient_helpers, multi_step, optimizer_wrappers, split_functions, split_step, step_decisions, templates
from ..ddp_guard import is_sync_context
from ..edits import drop_keeping_comments
from ..names import CLIP_FUNCTIONS
from ..plan import Blocked
from ..recognised import RecognisedStep, StepGroup
from ..scale_reads import refuse_scale_compared_after_update, refuse_scale_read_inside_step
from ..step_values import GUARDABLE, classify_value_statement, escaping_values, on_copies
from ..syntax import calls_method, code, dotted, method_call, only_expression
from . import Example, Pattern, Rule
from .loss_function import ForwardRegion

if TYPE_CHECKING:
    from ..steps import StepBuilder

__all__ = [
    "RULE",
    "StepBody",
    "classify_statement",
    "optimizer_of",
    "find_step_group",
    "group_edits",
    "plan_step_group",
    "require_every_iteration",
    "split_update",
    "step_group_after",
    "update_statement",
    "zero_grads_to_move",
]

RULE = Rule(
    name="step_function",
    order=50,
    description="the optimizer statements move, in order, into a step function for model.step",
    codes=("RPM102", "RPM106", "RPM107", "RPM134", "RPM135"),
    implemented_in=("rules/step_function.py", "step_decisions.py", "step_values.py"),
    patterns=(
        Pattern(
            "`scaler.unscale_`, `clip_grad_norm_`/`clip_grad_value_(model.parameters())`, `scaler.step`, `optimizer.zero_grad`, `model.zero_grad`, `scheduler.step()`",
            "moved, in order, into `_step_fn` for `model.step`; clipping uses `model.optim_parameters()`; `model.zero_grad(...)` becomes `optimizer.zero_grad(...)`; `scaler.update()` stays on the main thread after `model.step`",
            "`scaler.unscale_`、`clip_grad_norm_`/`clip_grad_value_(model.parameters())`、`scaler.step`、`optimizer.zero_grad`、`model.zero_grad`、`scheduler.step()`",
            "按原顺序移入交给 `model.step` 的 `_step_fn`；梯度裁剪改用 `model.optim_parameters()`；`model.zero_grad(...)` 变为 `optimizer.zero_grad(...)`；`scaler.update()` 留在主线程上，位于 `model.step` 之后",
        ),
        Pattern(
            "`optimizer.zero_grad()` at the top of the iteration",
            "moved to the end of `_step_fn` (equivalent: the step consumes the gradients)",
            "迭代开头的 `optimizer.zero_grad()`",
            "移到 `_step_fn` 的末尾（等价：步骤会消耗掉梯度）",
        ),
        Pattern(
            "gradient accumulation (`if (i + 1) % k == 0:` around the step)",
            "`forward_backward` every iteration, `model.step` + `scaler.update()` under the same condition",
            "梯度累积（步骤外包着 `if (i + 1) % k == 0:`）",
            "每次迭代都执行 `forward_backward`，`model.step` + `scaler.update()` 放在同一条件下",
        ),
        Pattern(
            "the backward as the last statement of the `with torch.autocast(...)` block, the step after that block",
            "the step group after the `with` is recognised as if the backward followed the block (a `zero_grad()` before the `with` stays there, on the optimizer and the model: rule model_zero_grad)",
            "反向传播是 `with torch.autocast(...)` 块的最后一条语句，优化器步骤在该块之后",
            "识别 `with` 之后的步骤组，如同反向传播在该块之后（`with` 之前的 `zero_grad()` 留在原处，同时作用于优化器和模型：规则 model_zero_grad）",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        optimizer.zero_grad()\n        with torch.autocast("cuda"):\n            loss = torch.nn.functional.mse_loss(model(x), y)\n            scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n',
            expect=(
                '        optimizer.zero_grad()\n        model.zero_grad()\n        with torch.autocast("cuda"):\n',
                "        def _step_fn():\n            scaler.step(optimizer)\n\n        model.step(_step_fn)\n        scaler.update()\n",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.unscale_(optimizer)\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "def _step_fn():\n            scaler.unscale_(optimizer)\n            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), 1.0)\n            scaler.step(optimizer)\n            optimizer.zero_grad()\n\n        model.step(_step_fn)\n        scaler.update()",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer, lambda: loss)\n        scaler.update()\n',
            codes=("RPM102",),
        ),
        Example(  # the optimizer statements after the backward stop before the scaler's step
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)\n        print(loss.item())\n        scaler.step(optimizer)\n        scaler.update()\n',
            codes=("RPM106",),
        ),
        Example(  # the scale updated before the step
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.update()\n        scaler.step(optimizer)\n',
            codes=("RPM134",),
        ),
        Example(
            'import torch\n\n\ndef save(scaler: "torch.amp.GradScaler"):\n    torch.save(scaler.state_dict(), "scaler.pt")  # checkpointing only\n',
        ),
    ),
)


def classify_statement(step: "StepBuilder", statement: cst.BaseStatement) -> Optional[str]:
    """The kind of a torch.amp step statement: ``unscale``, ``clip``, ``step``, ``update``,
    ``zero_grad``, ``scheduler``, an ``if`` holding only such statements (``guarded``), an
    ``if`` deciding on a measured norm (``decided``), a measured value
    (:func:`migrate.step_values.classify_value_statement`); None for any other statement."""
    value_kind = classify_value_statement(step, statement)  # grad norms, `if clip: ... else: ...`
    if value_kind is not None:
        return value_kind
    if only_expression(statement) is None and gradient_helpers.helper_kind(step, statement) == "measure":
        return "measure"  # `norms = clip_gradients(model, clip)`
    if (
        isinstance(statement, cst.If)
        and statement.orelse is None
        and isinstance(statement.body, cst.IndentedBlock)
        and all(step.classify(inner) in GUARDABLE for inner in statement.body.body)
    ):
        return "guarded"  # `if grad_clip: scaler.unscale_(opt); clip...(...)`
    if step_decisions.is_decided(step, statement):
        return "decided"  # `if not torch.isfinite(grad_norm): ...` around or before the step
    value = only_expression(statement)
    if not isinstance(value, cst.Call):
        return None
    for s in step.scaler_spellings:
        if method_call(value, s, "unscale_"):
            return "unscale"
        if method_call(value, s, "step"):
            return "step"
        if method_call(value, s, "update"):
            return "update"
    if step.facts.calls_any(value, CLIP_FUNCTIONS):
        return "clip"
    helper = gradient_helpers.helper_kind(step, statement)  # `clip_gradients(model, clip)`
    if helper is not None:
        return helper
    owner = step.rules.reference(value.func.value) if isinstance(value.func, cst.Attribute) else None
    if owner is not None and calls_method(value, "zero_grad"):
        return "zero_grad"
    if owner is not None and calls_method(value, "step"):
        if step.is_scheduler(owner, statement):
            return "scheduler"
    return None


def optimizer_of(step: "StepBuilder", group: List[cst.BaseStatement]) -> str:
    """The one optimizer the torch.amp step ``group`` steps (``scaler.step(optimizer)``);
    raises :class:`Blocked` for a group that steps none, several, or with extra arguments."""
    kinds = step_decisions.decision_kinds(step, group)
    if kinds.count("step") != 1 or kinds.count("update") > 1:
        raise multi_step.unsupported_group(step, group, kinds)
    if "update" in kinds and kinds.index("update") < kinds.index("step"):
        raise Blocked(group[0], "RPM134", "scaler.update() before scaler.step()")
    step_call = only_expression(next(s for s, kind in step.with_kinds(group) if kind == "step"))
    assert isinstance(step_call, cst.Call)  # what classify calls a step
    optimizer = step.rules.reference(step_call.args[0].value) if len(step_call.args) == 1 else None
    if optimizer is None and len(step_call.args) > 1:
        raise Blocked(step_call, "RPM102", "scaler.step() with extra arguments (e.g. a closure) is not migrated")
    if optimizer is None:
        raise Blocked(
            step_call, "RPM106", "scaler.step() is not given one optimizer by name or attribute; not migrated"
        )
    if "update" not in kinds:  # one of several steps sharing the scaler (a GAN)
        multi_step.require_update_later(step, group, optimizer)
    for statement, kind in step.with_kinds(group):
        call = only_expression(statement)
        if (
            kind == "unscale"
            and isinstance(call, cst.Call)  # what classify calls an unscale is
            and dotted(call.args[0].value if call.args else None) != optimizer
        ):
            raise Blocked(call, "RPM107", "unscale_() of another optimizer")
    return optimizer


def find_step_group(step: "StepBuilder") -> StepGroup:
    """The optimizer step statements: the first contiguous run of step statements after
    the backward, in this block or in the body of an ``if`` (gradient accumulation)
    that follows it; when the backward ends the body of a loop of micro-steps, of a
    ``no_sync``/``nullcontext`` block or of an autocast block (nothing after it uses the
    scaler), the same after that statement."""
    refuse_scale_read_inside_step(step)
    refuse_scale_compared_after_update(step)
    block, body, after = step.block, step.body, step.index
    while True:
        found, stopped = step_group_after(step, block, body, after)
        if found is not None:
            return found
        loop = step.facts.parent(block)
        climbable = isinstance(loop, (cst.For, cst.While)) and loop.orelse is None
        autocast = isinstance(loop, cst.With) and all(step.facts.is_autocast(item) for item in loop.items)
        if stopped or not (climbable or autocast or is_sync_context(step.facts, loop)):  # no_sync/nullcontext block
            break
        outer = step.facts.parent(loop)
        if not isinstance(outer, (cst.IndentedBlock, cst.Module)):
            break
        block, body = outer, list(outer.body)
        assert isinstance(loop, (cst.For, cst.While, cst.With))  # climbable, or a no_sync/nullcontext block
        after = body.index(loop)
    function = step.facts.enclosing(step.backward, (cst.FunctionDef,))
    wrapper = optimizer_wrappers.split_step_reason(step, function) if isinstance(function, cst.FunctionDef) else None
    detached = None if wrapper else split_step.detached_group(step)  # the optimizer work in another method
    detached = detached or (None if wrapper else split_functions.detached_function_group(step))
    if detached is not None:  # (an optimizer wrapper's methods are called in turn: no one step to move)
        return detached
    raise Blocked(
        step.backward,
        "RPM106",
        "no optimizer step (`scaler.step(optimizer)` + "
        "`scaler.update()`, or apex's `optimizer.step()`) follows the backward in "
        f"the same block{_after_split(step)}{_split_over_functions(step, function, wrapper)}",
    )


def _after_split(step: "StepBuilder") -> str:
    """Where the step was looked for, for a backward of a two-path split."""
    return (
        ""
        if step.split is None
        else " (the backward is one branch of a two-path `if`: the step is looked for after that `if`)"
    )


def _split_over_functions(step: "StepBuilder", function: Optional[cst.CSTNode], wrapper: Optional[str]) -> str:
    """Why no step follows, when the backward ends its ``function`` (nothing but a
    ``return`` after it): the step is in another function or method (mixins), or
    ``wrapper`` (:func:`optimizer_wrappers.split_step_reason`) says why not."""
    if not isinstance(function, cst.FunctionDef) or not step.ends_function(function):
        return ""
    if wrapper is not None:
        return wrapper
    return (
        f" ({function.name.value}() ends with it: a step split over several functions or "
        "methods, e.g. backward and update mixins, is not migrated)"
    )


def step_group_after(
    step: "StepBuilder", block: Union[cst.IndentedBlock, cst.Module], body: List[cst.BaseStatement], after: int
) -> Tuple[Optional[StepGroup], bool]:
    """The step group among ``body[after + 1:]``; ``True`` with None when a statement
    there uses the scaler without being one."""
    for position in range(after + 1, len(body)):
        statement = body[position]
        found = _step_run(step, block, body, position, None)
        if found is not None:
            return found, True
        if isinstance(statement, cst.If) and step.mentions(statement, step.anchor):
            if statement.orelse is not None:
                raise Blocked(statement, "RPM135", "conditional optimizer step with an else branch")
            inner: List[cst.BaseStatement] = list(statement.body.body)  # type: ignore[arg-type]
            for inner_position in range(len(inner)):
                found = _step_run(step, statement.body, inner, inner_position, statement)
                if found is not None:
                    return found, True
        if step.mentions(statement, step.anchor):
            return None, True
    return None, False


def _step_run(
    step: "StepBuilder",
    block: cst.CSTNode,
    statements: List[cst.BaseStatement],
    start: int,
    condition: Optional[cst.If],
) -> Optional[StepGroup]:
    if step.classify(statements[start]) is None:
        return None
    end = start
    while end < len(statements) and step.classify(statements[end]) is not None:
        end += 1
    return StepGroup(block, start, end, tuple(statements[start:end]), condition)


def zero_grads_to_move(step: "StepBuilder", region: ForwardRegion, recognised: RecognisedStep) -> List[int]:
    """Indices in this block of `optimizer/model.zero_grad()` before the backward (at the
    top of the iteration, or between loss and backward): they move to the step's end."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    found_at = [p for p in range(region.outer_index) if step.zero_grad_call(step.body[p], optimizer, model)]
    found_at += region.zero_grads
    if found_at:
        require_every_iteration(step, step.body[found_at[0]], found)
    return found_at


def require_every_iteration(step: "StepBuilder", zero_grad: cst.BaseStatement, found: StepGroup) -> None:
    """A ``zero_grad()`` before the backward moves to the step's end only when the step
    runs in every iteration that zeroes (not under a condition, nor after a loop of
    micro-steps): otherwise the zeroing would no longer discard the gradients between."""
    if found.block is not step.block:
        raise Blocked(
            zero_grad,
            "RPM135",
            "zero_grad() every iteration but an optimizer step "
            "under a condition or after a loop; not certain, left untouched",
        )


# ------------------------------------------------------------- emit: step
def plan_step_group(step: "StepBuilder", recognised: RecognisedStep, zero_grads: List[int]) -> None:
    """Emit the step function for ``recognised`` with ``model.step`` in place of its group,
    the ``zero_grads`` (indices in the backward's block) moved to its end."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    plan = step.rules.plan
    group = list(found.statements)
    step_fn = step.rules.plan.fresh("_step_fn")
    kinds = [step.classify(s) for s in group]
    group_edits(step, recognised)
    moved_zero = None
    if zero_grads:
        zero_call = only_expression(step.body[zero_grads[0]])
        assert isinstance(zero_call, cst.Call)  # a zero_grad() call (zero_grad_call)
        arguments = ", ".join(code(a).rstrip(", ") for a in zero_call.args)
        moved_zero = templates.statement(f"{optimizer}.zero_grad({arguments})\n")
    moved = [s for s, _ in step.with_kinds(group)]
    escaping = escaping_values(step, moved)
    on_copies_context = gradient_helpers.needs_optimizer_context(step, moved, model)
    in_order = step_decisions.main_thread_work(step, group)
    step_suffix = ", is_async=False" if step.rules.exact or escaping.names or in_order else ""
    branch_update = step_decisions.plan_branch_updates(step, group)

    def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        inside, update = step.step_body(updated, kinds, optimizer)
        update = update or branch_update
        if moved_zero is not None:
            inside.append(moved_zero)
        if on_copies_context:  # a helper walks `model.parameters()`: the copies there
            inside = gradient_helpers.in_optimizer_context(inside)
        if escaping.declaration is not None:
            inside = [escaping.declaration.with_changes(leading_lines=inside[0].leading_lines), *inside]
        definition = cst.ensure_type(templates.statement(f"def {step_fn}():\n    pass\n"), cst.FunctionDef)
        definition = definition.with_changes(
            leading_lines=inside[0].leading_lines,
            body=definition.body.with_changes(body=[inside[0].with_changes(leading_lines=()), *inside[1:]]),
        )
        call = templates.statement(f"{model}.step({step_fn}{step_suffix})\n")
        return [*escaping.bindings, definition, call] + ([update] if update is not None else [])

    plan.edits.replace_range(found.block, found.start, found.end, build)
    step.rules.plan.step_statements.update(step.body[index] for index in zero_grads)
    if multi_step.keeps_zero_grad_in_place(step):
        multi_step.zero_models_in_place(step, recognised, zero_grads)
    else:
        for index in zero_grads:
            plan.edits.replace_range(step.block, index, index + 1, drop_keeping_comments)
    step.rules.plan.step_statements.update(statement for statement, _ in step.with_kinds(group))
    plan.rewrites.append((group[0], step.step_rewrite))
    if escaping.names:
        plan.rewrites.append(
            (
                group[0],
                f"step run synchronously: {', '.join(escaping.names)} "
                "(measured in the step) is read on the main thread",
            )
        )
    if in_order:
        plan.rewrites.append(
            (
                in_order[0],
                "step run synchronously: the `if` choosing it from the measured norm does "
                "main-thread work in the step function, at its place in the iteration",
            )
        )


def group_edits(step: "StepBuilder", recognised: RecognisedStep) -> None:
    """Expression edits inside the ``recognised`` step's statements: clipping on the
    optimizer copies, ``model.zero_grad`` through the optimizer (whose parameters are the
    copies), and the edits of the step's own shape (:meth:`StepBuilder.shape_edits`)."""
    optimizer, model = recognised.optimizer, recognised.model
    for statement, kind in step.with_kinds(list(recognised.group.statements)):
        if kind == "clip":
            _clip_on_copies(step, statement, model)
        if kind == "measure":
            on_copies(step, statement, model)
        if kind == "zero_grad":
            call = only_expression(statement)
            assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)  # what classify found
            if step.rules.reference(call.func.value) == model or step.holds_model(call.func.value, model):
                step.rules.plan.edits.replace_expression(call.func.value, lambda _: cst.parse_expression(optimizer))
        step.shape_edits(statement, kind, optimizer)


def update_statement(step: "StepBuilder") -> cst.BaseStatement:
    """A new ``scaler.update()`` for the main thread, for a shape whose step group has none
    of its own (apex). With --exact no ``is_async=False`` is needed: after ``model.step(...,
    is_async=False)`` the step was waited for, so a plain ``update()`` applies this
    iteration's result (torch's sequence), and the line stays valid on upstream 0.1.1."""
    return templates.statement(f"{step.scaler}.update()\n")


#: (statements for the step function, the main-thread update); the statements are libcst
#: statement lines and compound statements, whose ``leading_lines`` the emission moves
#: (``BaseStatement`` itself declares none)
StepBody = Tuple[List[Any], Optional[cst.BaseStatement]]


def split_update(updated: List[cst.BaseStatement], kinds: List[Optional[str]]) -> StepBody:
    """(statements for the step function, the update statement) from the step group
    ``updated`` of ``kinds``: the scaler's update stays on the main thread."""
    if "update" not in kinds:  # the shared scaler's update comes after a later step
        return list(updated), None
    update_index = kinds.index("update")
    inside = [s for i, s in enumerate(updated) if i != update_index]
    return inside, updated[update_index]


def _clip_on_copies(step: "StepBuilder", statement: cst.BaseStatement, model: str) -> None:
    """``clip_grad_*_(model.parameters(), ...)`` clips ``model.optim_parameters()``."""
    call = only_expression(statement)
    assert call is not None  # a clip call (classify)
    for parameters in m.findall(call, m.Call(func=m.Attribute(attr=m.Name("parameters")))):
        assert isinstance(parameters, cst.Call) and isinstance(parameters.func, cst.Attribute)  # as matched
        owner = parameters.func.value
        if dotted(owner) == model or step.holds_model(owner, model):
            step.rules.plan.edits.replace_expression(
                parameters.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
            )
