"""Rule loss_function: forward + loss become forward_backward with a loss function holding exactly what the loss depends on.

The rule finds the forward region before the backward (:func:`forward_region`), decides
which of its statements the loss depends on and how the model is called
(:func:`plan_forward`, a frozen :class:`ForwardPlan`), and emits the loss function and the
``forward_backward`` call (:func:`emit_forward`). It works for a
:class:`~migrate.steps.StepBuilder` (``step``): the recognised step, its shape hooks
(``model_calls``, ``zero_grad_call``) and the shared context ``step.rules`` (bindings,
the plan, options).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, List, Optional, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import BuiltinAssignment

from .. import templates
from ..edits import carry_comments
from ..plan import Blocked
from ..syntax import (
    assigned_names,
    code,
    is_assignment_line,
    is_plain_line,
    names_in,
    names_outside,
    only_assignment,
    statements_of,
    written_and_read,
)
from . import Example, Pattern, Rule

if TYPE_CHECKING:
    from ..recognised import RecognisedStep
    from ..steps import StepBuilder

__all__ = ["RULE", "ForwardPlan", "ForwardRegion", "emit_forward", "forward_region", "plan_forward"]

#: a torch.amp step of the recognised shape
_PLAIN = 'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n'

RULE = Rule(
    name="loss_function",
    order=30,
    description="forward + loss become forward_backward with a loss function holding exactly what the loss depends on",
    codes=("RPM107", "RPM113", "RPM130", "RPM131", "RPM132", "RPM137"),
    implemented_in=("rules/loss_function.py",),
    patterns=(
        Pattern(
            "`out = model(inputs)` + the statements computing `loss`",
            "a nested `_loss_fn(out, labels)` with exactly the statements the loss depends on, returning `scaler.scale(loss) / NUM_MICROBATCH`; where the code reads `loss` after the backward, `loss` is then the sum of the unscaled per-microbatch losses the loss function saw (`_losses`; not built when nothing reads it), so it logs the original's value at any scale (dividing the returned scaled sum by `get_scale()` would give inf once loss × scale overflows float32)",
            "`out = model(inputs)` 加上计算 `loss` 的语句",
            "一个嵌套的 `_loss_fn(out, labels)`，只包含损失真正依赖的语句，返回 `scaler.scale(loss) / NUM_MICROBATCH`；若代码在反向传播之后还读取 `loss`，之后 `loss` 是损失函数内看到的各微批次未缩放损失之和（`_losses`；没有代码读取时不生成），因此在任何缩放值下记录的都是原脚本的值（若把返回的已缩放之和除以 `get_scale()`，一旦 loss × scale 超出 float32 范围就会得到 inf）",
        ),
        Pattern(
            "labels",
            "values of this iteration (loop target, assigned in the loop body before the forward, or bound with the model's inputs by a next-batch fetch; function parameters without a loop) that the loss reads become `label=` so microbatching splits them; other values are captured as they are",
            "标签",
            "损失计算读取的、本次迭代的值（循环目标、在循环体中前向传播之前赋值的变量，或由取下一批数据的语句与模型输入一起绑定的变量；没有循环时为函数参数）变为 `label=`，以便按微批次切分；其他值按原样捕获",
        ),
        Pattern(
            "model keyword arguments, `**batch`",
            "`input_kwargs={...}` / `input_kwargs=batch`",
            "模型的关键字参数、`**batch`",
            "`input_kwargs={...}` / `input_kwargs=batch`",
        ),
        Pattern(
            'loss with `reduction="sum"` (in the call or the criterion)',
            "not divided by `NUM_MICROBATCH` (per-microbatch sums already add up)",
            '使用 `reduction="sum"` 的损失（在调用中或在 criterion 中）',
            "不除以 `NUM_MICROBATCH`（各微批次的和本来就能直接相加）",
        ),
        Pattern(
            "outputs used after the step (accuracy)",
            "`return_outputs=True`, the outputs variable keeps its name",
            "在优化器步骤之后使用的输出（如准确率）",
            "`return_outputs=True`，输出变量保持原名",
        ),
        Pattern(
            "`get_scale()` logging, `loss.item()` logging",
            "unchanged",
            "`get_scale()` 日志、`loss.item()` 日志",
            "不变",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print(loss.item())\n',
            expect=(
                "_losses.append(loss.detach().cpu() / NUM_MICROBATCH)",
                "return scaler.scale(loss) / NUM_MICROBATCH",
                "model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)",
                "loss = sum(_losses)",
            ),
        ),
        Example(  # the loss is not read after the backward: no `_losses` to rebuild it
            _PLAIN,
            expect=(
                "                return scaler.scale(loss) / NUM_MICROBATCH\n\n            model.forward_backward(",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y, reduction="sum")\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=("return scaler.scale(loss)\n",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print((out.argmax(1) == y).float().mean())\n',
            expect=("return_outputs=True)[1]",),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    sum = 0  # a user\'s own `sum`\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n        print(loss.item())\n',
            codes=("RPM137",),
        ),
        Example(  # the scaled loss is bound first: not the recognised backward statement
            _PLAIN.replace(
                "        scaler.scale(loss).backward()\n",
                "        scaled = scaler.scale(loss)\n        scaled.backward()\n",
            ),
            codes=("RPM130",),
        ),
        Example(  # backward(inputs=...): no forward_backward form
            _PLAIN.replace(
                "scaler.scale(loss).backward()", "scaler.scale(loss).backward(inputs=list(model.parameters()))"
            ),
            codes=("RPM130",),
        ),
        Example(
            "import torch\n\n# GradScaler mentioned in a comment only; the loss is computed without one\nloss = torch.ones(1).sum()\n",
        ),
    ),
)


def forward_region(step: "StepBuilder", recognised: "RecognisedStep") -> "ForwardRegion":
    """Where the forward and the loss of the ``recognised`` step are (nothing planned yet);
    the ``zero_grad()`` calls between the loss and the backward are noted in it."""
    model, optimizer = recognised.model, recognised.optimizer
    end = step.index
    while end > 0 and step.zero_grad_call(step.body[end - 1], optimizer, model):
        end -= 1  # zero_grad() between loss and backward: moved into the step function
    if end == 0:
        raise Blocked(step.backward, "RPM131", "no forward pass before the backward")
    return replace(_region_before(step, model, end), zero_grads=tuple(range(end, step.index)))


def _region_before(step: "StepBuilder", model: str, end: int) -> "ForwardRegion":
    """The forward region ending right before ``step.body[end]``."""
    previous = step.body[end - 1]
    if isinstance(previous, cst.With):
        if not all(step.facts.is_autocast(item) for item in previous.items):
            raise Blocked(previous, "RPM131", "forward inside a `with` block that is not autocast")
        inner = statements_of(previous.body)
        start = _model_statement(step, inner, model, previous)
        return ForwardRegion(previous.body, inner, start, len(inner), previous, end - 1)
    split = _split_region(step, model, end)
    if split is not None:
        return split
    start = _model_statement(step, step.body[:end], model, step.backward)
    return ForwardRegion(step.block, step.body, start, end, None, start)


def _split_region(step: "StepBuilder", model: str, end: int) -> Optional["ForwardRegion"]:
    """Forward inside ``with autocast(...)``, loss computed after the block (outside
    autocast): the outside statements run in the loss function with autocast disabled."""
    position = end - 1
    while position >= 0 and is_plain_line(step.body[position]) and not step.model_calls(step.body[position], model):
        position -= 1
    if position < 0 or position == end - 1 or not isinstance(step.body[position], cst.With):
        return None
    with_statement = cst.ensure_type(step.body[position], cst.With)
    if len(with_statement.items) != 1 or not step.facts.is_autocast(with_statement.items[0]):
        return None
    inner = statements_of(with_statement.body)
    start = _model_statement(step, inner, model, with_statement)
    outside = step.body[position + 1 : end]
    return ForwardRegion(
        with_statement.body, inner, start, len(inner), with_statement, position, outside, (position + 1, end)
    )


def _model_statement(step: "StepBuilder", statements: List[cst.BaseStatement], model: str, at: cst.CSTNode) -> int:
    position = len(statements) - 1
    while position >= 0 and is_plain_line(statements[position]):
        if step.model_calls(statements[position], model):
            return position
        position -= 1
    raise Blocked(
        at,
        "RPM131",
        f"the forward pass (a call of {model!r} followed only by "
        "simple statements computing the loss) was not found before the backward",
    )


# ------------------------------------------------------------- emit: forward
def plan_forward(step: "StepBuilder", region: "ForwardRegion", model: str) -> "ForwardPlan":
    """The forward + loss as the loss function will hold them (nothing emitted yet)."""
    statements = region.statements[region.start : region.end] + region.outside
    model_calls = [c for s in statements for c in step.model_calls(s, model)]
    if len(model_calls) != 1:
        raise Blocked(
            statements[0], "RPM107", f"{model!r} is called {len(model_calls)} times in the forward; not migrated"
        )
    model_call = model_calls[0]
    first = statements[0]
    output_name, drop_first = _output_binding(step, first, model_call)
    loss_name = step.loss.value if isinstance(step.loss, cst.Name) else None
    moved = _loss_slice(step, statements, output_name)
    moved_statements = [s for s, inside in zip(statements, moved) if inside]
    outside_names = _names_outside(step, moved_statements)
    assigned = {n for s in moved_statements for n in written_and_read(s)[0]}
    _check_kept(step, statements, moved, assigned, {loss_name, output_name})
    _check_scaler_bound_before(step, statements)
    leaking = (assigned - {loss_name, output_name}) & outside_names
    if leaking:
        raise Blocked(
            first,
            "RPM113",
            f"values computed in the forward "
            f"({', '.join(sorted(leaking))}) are read outside the loss computation; "
            "moving them into the loss function would change them there; not migrated",
        )
    kept = [s for s, inside in zip(statements, moved) if not inside]
    labels = _labels(step, region, moved_statements, model_call, assigned, kept)
    _check_locals(step, moved_statements, {output_name or "", *labels})
    input_args, input_kwargs = _inputs(model_call)
    return ForwardPlan(
        model=model,
        model_call=model_call,
        output_name=output_name,
        drop_first=drop_first,
        labels=tuple(labels),
        input_args=tuple(input_args),
        input_kwargs=input_kwargs,
        loss_name=loss_name,
        return_outputs=output_name is not None and output_name in outside_names,
        sum_reduced=_sum_reduced(step, moved_statements),
        moved=tuple(moved),
    )


def _loss_slice(step: "StepBuilder", statements: List[cst.BaseStatement], output_name: Optional[str]) -> List[bool]:
    """Which forward-region statements the loss depends on (they move into the loss
    function): the model call, and walking backwards every statement binding a name
    that a later moved statement (or the loss) reads. The rest keeps its place."""
    needed = set(names_in(step.loss))
    moved = [False] * len(statements)
    for position in range(len(statements) - 1, 0, -1):
        written, read = written_and_read(statements[position])
        if written & needed:
            moved[position] = True
            needed = (needed - written) | read
    moved[0] = True
    if output_name is not None and output_name not in needed:
        raise Blocked(statements[0], "RPM131", "the loss does not depend on the model's output; not migrated")
    return moved


def _check_kept(
    step: "StepBuilder",
    statements: List[cst.BaseStatement],
    moved: List[bool],
    assigned: Set[str],
    available: Set[Optional[str]],
) -> None:
    """A statement that stays on the main thread runs after ``forward_backward``: it may
    read the loss and the outputs (returned by it), but nothing else the loss function
    computes, and it must not touch what a later moved statement reads."""
    for position, statement in enumerate(statements):
        if moved[position]:
            continue
        written, read = written_and_read(statement)
        later_moved = [s for s, inside in zip(statements[position + 1 :], moved[position + 1 :]) if inside]
        later_names = {n for s in later_moved for n in names_in(s)}
        rebound_later = {n for s in later_moved for n in written_and_read(s)[0]}
        touched = (written & assigned) | (read & (assigned - available))
        touched |= (written | read) & later_names
        touched |= read & available & rebound_later
        if touched:
            raise Blocked(
                statement,
                "RPM113",
                f"this statement between the forward and the "
                f"backward uses {', '.join(sorted(touched))}, which the loss "
                "computation also uses; it cannot stay before or move into the "
                "loss function without changing what it sees; not migrated",
            )


def _check_scaler_bound_before(step: "StepBuilder", statements: List[cst.BaseStatement]) -> None:
    """The loss function returns ``scaler.scale(loss)``: a statement of the forward
    region binding the scaler's name (``scaler = state["scaler"]`` after the forward)
    would run after the loss function reads it."""
    root = step.scaler.partition(".")[0].partition("[")[0]
    for statement in statements:
        if root in written_and_read(statement)[0]:
            raise Blocked(
                statement,
                "RPM113",
                f"this statement between the forward and the backward binds {root!r}, which scales the loss; "
                "the loss function would read it before it is bound; not migrated",
            )


def _check_locals(step: "StepBuilder", moved: List[cst.BaseStatement], parameters: Set[str]) -> None:
    """Inside the loss function every name the moved statements bind is local: reading
    one before its first binding there would raise ``UnboundLocalError``."""
    bound = set(parameters)
    assigned = {n for s in moved for n in written_and_read(s)[0]}
    for statement in moved:
        written, read = written_and_read(statement)
        early = (read & assigned) - bound
        if early:
            raise Blocked(
                statement,
                "RPM113",
                f"{', '.join(sorted(early))} is read here "
                "before the loss computation binds it; inside a loss function that "
                "would be an UnboundLocalError; not migrated",
            )
        bound |= written


def _names_outside(step: "StepBuilder", moved: List[cst.BaseStatement]) -> Set[str]:
    """Names used in the step's function (or module) outside the moved statements."""
    scope_node = step.facts.enclosing(step.backward, (cst.FunctionDef,)) or step.facts.module
    return names_outside(step.facts, scope_node, set(moved))


def _sum_reduced(step: "StepBuilder", statements: List[cst.BaseStatement]) -> bool:
    """The loss sums over the batch (``reduction="sum"`` in it or in its criterion):
    then per-microbatch losses already add up and are not divided."""

    summing = m.Arg(keyword=m.Name("reduction"), value=m.SimpleString('"sum"') | m.SimpleString("'sum'"))

    def says_sum(node: cst.CSTNode) -> bool:
        return any(m.matches(arg, summing) for arg in step.facts.find_under(node, cst.Arg))

    for statement in statements:
        if says_sum(statement):
            return True
        for call in step.facts.find_under(statement, cst.Call):
            if not isinstance(call.func, cst.Name):
                continue
            try:
                binding = step.rules.binding(call.func.value, statement)
            except Blocked:
                continue
            if binding.value is not None and says_sum(binding.value):
                return True
    return False


def _output_binding(step: "StepBuilder", first: cst.BaseStatement, model_call: cst.Call) -> Tuple[Optional[str], bool]:
    small = only_assignment(first)
    if small is not None and small.value is model_call and len(small.targets) == 1:
        target = small.targets[0].target
        if isinstance(target, cst.Name):
            return target.value, True
    return None, False


def _next_batch_names(step: "StepBuilder", model_call: cst.Call, kept: List[cst.BaseStatement]) -> Set[str]:
    """Names bound, after the forward, by the statement that fetches the next batch (the
    one that rebinds the model's inputs, ``x, y = next(it)``): this iteration's data too."""
    loop = step.facts.enclosing(step.backward, (cst.For, cst.While, cst.FunctionDef))
    if not isinstance(loop, (cst.For, cst.While)):
        return set()
    inputs = set(names_in(model_call))
    names: Set[str] = set()
    for statement in [*kept, *step.body[step.index + 1 :]]:
        written = written_and_read(statement)[0] if is_assignment_line(statement) else set()
        if written & inputs:
            names |= written
    return names


def _batch_names(step: "StepBuilder", region: "ForwardRegion") -> Set[str]:
    """Names holding this iteration's data: the loop target and everything assigned in
    the loop body before the forward; without a loop, the function's parameters. A
    loss input among them is a label (split with the microbatches); anything else the
    loss reads is captured by the loss function as it is."""
    loop = step.facts.enclosing(step.backward, (cst.For, cst.While, cst.FunctionDef))
    names: Set[str] = set()
    if isinstance(loop, (cst.For, cst.While)):
        if isinstance(loop, cst.For):
            names |= set(names_in(loop.target))
        earlier = _earlier_in_loop_body(step, loop) + step.body[: region.outer_index]
        if region.with_statement is not None:
            earlier = earlier + region.statements[: region.start]
        for statement in earlier:
            if is_assignment_line(statement):
                names |= set(assigned_names(statement))
    elif isinstance(loop, cst.FunctionDef):
        names |= {p.name.value for p in loop.params.params}
        names -= {step.rules.attributes.receiver_of(loop)}  # `self` is no batch data
    return names


def _earlier_in_loop_body(step: "StepBuilder", loop: Union[cst.For, cst.While]) -> List[cst.BaseStatement]:
    """The statements before the compound statements (``if scaler is not None:``, ``with
    torch.autocast(...):``, ``no_sync`` blocks) that hold the step's block, in each block
    around them up to the loop's body (where this iteration's batch is assigned)."""
    found: List[cst.BaseStatement] = []
    node: Optional[cst.CSTNode] = step.block
    while node is not None and node is not loop.body:
        parent = step.facts.parent(node)
        if isinstance(parent, cst.IndentedBlock) and isinstance(node, cst.BaseStatement):
            body = list(parent.body)
            found = body[: body.index(node)] + found
        node = parent
    return found


def _labels(
    step: "StepBuilder",
    region: "ForwardRegion",
    statements: List[cst.BaseStatement],
    model_call: cst.Call,
    assigned: Set[str],
    kept: List[cst.BaseStatement],
) -> List[str]:
    batch = _batch_names(step, region) | _next_batch_names(step, model_call, kept)
    free: List[str] = []
    for statement in statements:
        for name in names_in(statement):
            if name in batch and name not in assigned and name not in free:
                free.append(name)
    inputs = set(names_in(model_call))
    return [n for n in free if n not in inputs or _used_outside_call(step, statements, model_call, n)]


def _used_outside_call(step: "StepBuilder", statements, model_call, name) -> bool:
    total = sum(names_in(s).count(name) for s in statements)
    return total > names_in(model_call).count(name)


def _inputs(
    model_call: cst.Call,
) -> Tuple[List[cst.BaseExpression], Union[Tuple[Tuple[str, cst.BaseExpression], ...], cst.BaseExpression]]:
    args: List[cst.BaseExpression] = []
    kwargs: List[Tuple[str, cst.BaseExpression]] = []
    star_kwargs: Optional[cst.BaseExpression] = None
    for arg in model_call.args:
        if arg.star == "*":
            raise Blocked(model_call, "RPM132", "model called with *args; not migrated")
        if arg.star == "**":
            star_kwargs = arg.value
        elif arg.keyword is not None:
            kwargs.append((arg.keyword.value, arg.value))
        else:
            args.append(arg.value)
    if star_kwargs is not None and kwargs:
        raise Blocked(model_call, "RPM132", "model called with **kwargs and keywords; not migrated")
    return args, (star_kwargs if star_kwargs is not None else tuple(kwargs))


def emit_forward(step: "StepBuilder", region: "ForwardRegion", forward: "ForwardPlan") -> None:
    plan = step.rules.plan
    loss_fn = step.rules.plan.fresh("_loss_fn")
    labels = list(forward.labels)
    out_param = forward.output_name or step.rules.plan.fresh("_outputs")
    label_param = labels[0] if len(labels) == 1 else step.rules.plan.fresh("_labels" if labels else "_label")
    if forward.output_name is None:
        plan.edits.replace_expression(forward.model_call, lambda _: cst.Name(out_param))
    divisor = "" if forward.sum_reduced else f" / {plan.microbatch}"
    head = f"    {', '.join(labels)} = {label_param}\n" if len(labels) > 1 else ""
    call_text = f"{forward.model}.forward_backward({_call_arguments(forward, labels)}, loss_fn={loss_fn}"
    call_text += ", return_outputs=True)[1]" if forward.return_outputs else ")"
    # The loss is logged as the loss function saw it, unscaled: dividing the returned
    # (scaled) sum by the scale would give inf once loss * scale overflows.
    scope = step.facts.scope(forward.model_call)
    logged = forward.loss_name if forward.loss_name and _read_elsewhere(step, region, forward) else None
    if logged and scope is not None and any(not isinstance(a, BuiltinAssignment) for a in scope["sum"]):
        raise Blocked(
            forward.model_call,
            "RPM137",
            "the file binds its own `sum`, which the "
            "migrated loss logging (`loss = sum(_losses)`) needs as the builtin; "
            "not migrated",
        )
    losses = step.rules.plan.fresh("_losses") if logged else None
    capture = [f"{losses}.append({forward.loss_name}.detach().cpu(){divisor})\n"] if losses else []
    call_line = f"{forward.output_name} = {call_text}\n" if forward.return_outputs else f"{call_text}\n"
    after = (
        ([f"{losses} = []\n"] if losses else [])
        + [call_line]
        + ([f"{forward.loss_name} = sum({losses})\n"] if losses else [])
    )
    inside_count = region.end - region.start
    inside_moved = forward.moved[:inside_count]
    outside_moved = forward.moved[inside_count:]
    outside = _outside_autocast(step, region, [s for s, keep in zip(region.outside, outside_moved) if keep])
    returned = templates.statement(f"return {step.scaled_loss()}{divisor}\n")
    drop = 1 if forward.drop_first else 0

    def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        body = [s for s, keep in list(zip(updated, inside_moved))[drop:] if keep] + outside
        kept = [s for s, keep in zip(updated, inside_moved) if not keep]
        definition = templates.statement(f"def {loss_fn}({out_param}, {label_param}):\n{head}    pass\n")
        assert isinstance(definition, cst.FunctionDef) and isinstance(definition.body, cst.IndentedBlock)
        inner = [*definition.body.body[:-1], *body, *map(templates.statement, capture), returned]
        definition = definition.with_changes(body=definition.body.with_changes(body=inner))
        return [carry_comments(updated[:drop], definition), *map(templates.statement, after), *kept]

    plan.edits.replace_range(region.block, region.start, region.end, build)
    if region.outside:  # the moved statements carry their own comments
        plan.edits.replace_range(
            step.block,
            *region.outside_range,
            lambda updated: [s for s, keep in zip(updated, outside_moved) if not keep],
        )
    plan.rewrites.append((forward.model_call, "forward + loss -> model.forward_backward(loss_fn=...)"))


def _read_elsewhere(step: "StepBuilder", region: "ForwardRegion", forward: "ForwardPlan") -> bool:
    """The loss variable is used besides the forward and the backward (or is a global,
    which any code may read): only then does the migrated code rebuild it."""
    function = step.facts.enclosing(step.backward, (cst.FunctionDef,))
    if function is None:
        return True
    statements = region.statements[region.start : region.end] + region.outside
    skipped: Set[cst.CSTNode] = {s for s, inside in zip(statements, forward.moved) if inside}
    skipped.add(step.replaced_backward())
    return bool({forward.loss_name, "locals", "vars"} & names_outside(step.facts, function, skipped))


def _call_arguments(forward: "ForwardPlan", labels: List[str]) -> str:
    """``input_args=(...)[, input_kwargs=...][, label=...]`` for forward_backward."""
    argument_text = ", ".join(code(a) for a in forward.input_args)
    if len(forward.input_args) == 1:
        argument_text += ","
    text = f"input_args=({argument_text})"
    kwargs = forward.input_kwargs
    if isinstance(kwargs, tuple) and kwargs:
        text += ", input_kwargs={" + ", ".join(f'"{k}": {code(v)}' for k, v in kwargs) + "}"
    elif isinstance(kwargs, cst.BaseExpression):
        text += f", input_kwargs={code(kwargs)}"
    if labels:
        text += f", label={labels[0]}" if len(labels) == 1 else f", label=({', '.join(labels)})"
    return text


def _outside_autocast(
    step: "StepBuilder", region: "ForwardRegion", statements: List[cst.BaseStatement]
) -> List[cst.BaseStatement]:
    """``with <the same autocast>(<its device>, enabled=False): <statements>`` for loss
    statements that ran after the autocast block, so they keep running outside it."""
    if not statements or region.with_statement is None:
        return []
    call = cst.ensure_type(region.with_statement.items[0].item, cst.Call)  # an autocast(...) call
    legacy = step.facts.calls_any(
        call, {"torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
    )
    kept = [] if legacy else [a for a in call.args if a.keyword is None][:1]
    kept += [a for a in call.args if a.keyword is not None and a.keyword.value == "device_type"]
    arguments = ", ".join(code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in kept)
    off = f"{arguments}, enabled=False" if arguments else "enabled=False"
    block = cst.ensure_type(cst.parse_statement(f"with {code(call.func)}({off}):\n    pass\n"), cst.With)
    return [block.with_changes(body=block.body.with_changes(body=list(statements)))]


@dataclass(frozen=True)
class ForwardPlan:
    """A recognised forward + loss, as it will be emitted.

    ``moved[i]`` says whether statement ``i`` of the forward region (the model call first,
    then the statements up to the backward, then those after an autocast block) moves into
    the loss function; the others stay on the main thread, after ``forward_backward``."""

    model: str
    model_call: cst.Call
    output_name: Optional[str]
    drop_first: bool  # the model call's own line (``out = model(x)``) becomes the parameter
    labels: Tuple[str, ...]
    input_args: Tuple[cst.BaseExpression, ...]
    input_kwargs: Union[Tuple[Tuple[str, cst.BaseExpression], ...], cst.BaseExpression]
    loss_name: Optional[str]
    return_outputs: bool
    sum_reduced: bool
    moved: Tuple[bool, ...]


@dataclass(frozen=True)
class ForwardRegion:
    """Where the forward + loss statements are: ``statements[start:end]`` of ``block``;
    ``outside`` are loss statements after an autocast block (``outside_range`` in the
    backward's block), ``zero_grads`` the indices, in the backward's block, of
    ``zero_grad()`` calls between the loss and the backward."""

    block: cst.CSTNode
    statements: List[cst.BaseStatement]
    start: int
    end: int
    with_statement: Optional[cst.With]
    outer_index: int  # index in the backward's block of the first statement of the region
    outside: List[cst.BaseStatement] = field(default_factory=list)  # loss after the autocast block
    outside_range: Tuple[int, int] = (0, 0)
    zero_grads: Tuple[int, ...] = ()
