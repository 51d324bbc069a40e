"""Rule model_wrap: the model is wrapped with roundpipe.RoundPipe where the optimizer is built.

:func:`model_for` follows the step's optimizer to every place it is built, finds the model
it is built on (through DDP guards, aliases, helpers, state objects and callers), refuses a
DDP/DataParallel model, and plans the wrap (:func:`plan_model_wrap`) and the optimizer's
``model.optim_parameters()``. It works for a :class:`~migrate.steps.StepBuilder`
(``step``) and its shared context ``step.rules``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple

import libcst as cst

from .. import multi_step, templates
from ..attributes import InstanceFamily, check_wrap, wrap_where_bound, wrapped
from ..constructor_alias import constructor_alias
from ..ddp_guard import aliased_models, find_ddp_guard, plan_ddp_guard
from ..handed_in import handed_model, plan_handed_wrap
from ..optimizer_helpers import grouped_before, helper_model, plan_adopting_wrap
from ..origins import origins, parameters_fed
from ..parallel import parallel_call
from ..plan import Binding, Blocked
from ..syntax import calls_method, code, exclusive, receiver
from . import Example, Pattern, Rule

if TYPE_CHECKING:
    from ..steps import StepBuilder
    from ..torch_amp import TorchAmpRules

__all__ = ["RULE", "local_name_for", "model_for", "plan_helper_wrap", "plan_model_wrap"]

RULE = Rule(
    name="model_wrap",
    order=60,
    description="the model is wrapped with roundpipe.RoundPipe where the optimizer is built",
    codes=("RPM101", "RPM108"),
    implemented_in=("rules/model_wrap.py", "parallel.py", "ddp_guard.py", "handed_in.py", "optimizer_helpers.py"),
    patterns=(
        Pattern(
            "the model",
            "wrapped with `roundpipe.RoundPipe` right before the optimizer is built, and the optimizer built on `model.optim_parameters()`",
            "模型",
            "在构建优化器之前用 `roundpipe.RoundPipe` 包装，优化器改为在 `model.optim_parameters()` 上构建",
        ),
        Pattern(
            "training loop in a function receiving model/optimizer/scaler from callers in the same file",
            "followed through the call sites",
            "位于函数中的训练循环，其 model/optimizer/scaler 由同一文件中的调用者传入",
            "沿调用点追踪",
        ),
    ),
    examples=(
        Example(
            'import torch\n\n\ndef train(model, batches):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            expect=(
                "model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))\n    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)",
            ),
        ),
        Example(
            'import torch\n\n\ndef train(model, batches):\n    model = torch.nn.DataParallel(model)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    scaler = torch.amp.GradScaler("cuda")\n    for x, y in batches:\n        with torch.autocast("cuda"):\n            out = model(x)\n            loss = torch.nn.functional.mse_loss(out, y)\n        scaler.scale(loss).backward()\n        scaler.step(optimizer)\n        scaler.update()\n        optimizer.zero_grad()\n',
            codes=("RPM101",),
        ),
        Example(
            "import torch\n\n# a plain fp32 model and optimizer; GradScaler only named in this comment\nmodel = torch.nn.Linear(2, 2)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        ),
    ),
)


def model_for(step: "StepBuilder", optimizer: str) -> str:
    """The model's name in the step's scope; plans the wrap and the optimizer rewrite
    for every place the step's optimizer is built (a training function called for two
    models wraps each)."""
    step.builds = []
    local_names: Set[str] = set()
    for built in origins(step.rules, optimizer, step.step_site):
        model_outer, local = _model_built_with(step, built)
        if any(
            b.scope is built.scope and outer == model_outer and not exclusive(step.facts, b.statement, built.statement)  # type: ignore[arg-type]
            for b, outer in step.builds
        ):
            raise Blocked(
                built.statement or step.backward,
                "RPM107",
                f"the model {model_outer!r} is trained with several optimizers through one step",
            )
        step.builds.append((built, model_outer))
        local_names.add(_through_state(step, optimizer, built, model_outer) or local)
    if len(local_names) != 1:
        raise Blocked(step.backward, "RPM107", "the step trains models it sees under different names")
    step.built, step.model_outer = step.builds[0]
    return local_names.pop()


def _through_state(step: "StepBuilder", optimizer: str, built: Binding, model: str) -> Optional[str]:
    """The step's reference to the model when it reads the optimizer through a state
    object (``state.optimizer`` -> ``state.model``, see :mod:`migrate.state_objects`)."""
    states = step.rules.state_objects
    found = states.lookup(optimizer, step.backward)
    if found is None:
        return None
    build = found[0]
    statement = built.statement
    if (
        statement is None
        or step.facts.scope(build) is not built.scope
        or step.facts.order(build) < step.facts.order(statement)
    ):
        raise Blocked(
            build,
            "RPM125",
            f"the state object is built before (or away from) its optimizer {optimizer!r}: it would "
            "hold the model unwrapped; left untouched",
        )
    return states.model_reference(optimizer, model, step.backward)


def _model_built_with(step: "StepBuilder", built: Binding) -> Tuple[str, str]:
    """(the model's name where ``built`` builds the optimizer, its name in the step's
    scope); plans the wrap and the optimizer rewrite."""
    if not isinstance(built.value, cst.Call):
        raise Blocked(
            built.statement or step.backward,
            "RPM108",
            f"optimizer {built.name or code(built.value or cst.Name('?'))!r} is not built by a call in this file",
        )
    parameter_calls = [
        call
        for call in step.facts.subtree(built.value, cst.Call)
        if calls_method(call, "parameters") and not call.args and step.rules.reference(receiver(call))
    ]
    owners = {owner for call in parameter_calls if (owner := step.rules.reference(receiver(call)))}
    if owners:  # `AdamW(groups + [{"params": criterion.parameters()}])`, `groups` holding the model's
        owners |= grouped_before(step, built)
    if len(owners) > 1:
        optimizer = built.name or code(built.value)
        raise Blocked(built.value, "RPM108", multi_step.several_models_message(optimizer, owners))
    if not owners:  # `create_optimizer(model, cfg)`: a helper groups the parameters
        found = helper_model(step, built)
        if found is not None:
            model_outer, local = found
            _reject_parallel(step, model_outer, built)
            plan_adopting_wrap(step, built, model_outer)
            return model_outer, local
    if not owners and not _groups_parameters(step, built.value):  # `self.exp.get_optimizer(bs)`
        raise Blocked(built.value, "RPM108", _untraced_message(built.value))
    if len(owners) != 1:
        raise Blocked(
            built.value,
            "RPM108",
            "the optimizer is not built on "
            "`model.parameters()` of one model (parameter groups of submodules "
            "cannot be mapped to RoundPipe's optimizer copies)",
        )
    model_outer = owners.pop()
    model_outer = constructor_alias(step.rules, built, model_outer) or model_outer  # `self.model = model`
    if "." in model_outer and not isinstance(built.scope, InstanceFamily):
        raise Blocked(
            built.value, "RPM108", f"the optimizer is built on {model_outer!r} outside its class's own attributes"
        )
    guard, aliases = None, set()  # DDP guards and aliases are followed for names only
    if isinstance(built.scope, InstanceFamily):
        if plan_handed_wrap(step, built, model_outer, parameter_calls):  # `Trainer(model)`: wrapped there
            return model_outer, model_outer
        check_wrap(built.scope, model_outer, built)
    else:
        guard = find_ddp_guard(step.facts, built, model_outer)  # `if args.distributed: model = DDP(model)`
        model_outer = guard.model if guard is not None else model_outer
        aliases = aliased_models(step.facts, built, model_outer)
    for trained in {model_outer, *aliases}:
        _reject_parallel(step, trained, built, guard.statement if guard is not None else None)
    if guard is None:  # `model_without_ddp = model` before the wrap, `model` read after it
        _refuse_source_read_after_wrap(step, built, model_outer, aliases)
    plan_model_wrap(step.rules, built, model_outer, parameter_calls)
    if guard is not None:
        plan_ddp_guard(step, built, guard)
    return model_outer, local_name_for(step, model_outer, built)


def _untraced_message(call: cst.Call) -> str:
    """Why the optimizer ``call`` builds is not traced to the model the step trains: what it
    is handed, when that is a name or an attribute."""
    handed = [code(a.value) for a in call.args if isinstance(a.value, (cst.Name, cst.Attribute))]
    given = f"handed {', '.join(handed)}" if handed else "handed no model"
    return (
        f"the optimizer is built by `{code(call.func)}(...)` ({given}, no `.parameters()` in the call): "
        "the migration cannot trace its parameters to a model the step calls in its forward"
    )


def _groups_parameters(step: "StepBuilder", value: cst.Call) -> bool:
    """``value`` calls ``.parameters()`` or ``.named_parameters()`` of something."""
    return any(
        calls_method(call, "parameters") or calls_method(call, "named_parameters")
        for call in step.facts.subtree(value, cst.Call)
    )


def _refuse_source_read_after_wrap(step: "StepBuilder", built: Binding, model: str, sources: Set[str]) -> None:
    """RPM114 when ``model`` (wrapped right before its optimizer) was bound from one of
    ``sources`` (``model_without_ddp = model``) and that name is read after the wrap: it
    would still hold the unwrapped module (a forward on it would bypass RoundPipe)."""
    assert built.statement is not None  # an optimizer bound by a statement (origins)
    after = step.facts.order(built.statement)
    for source in sorted(sources):
        for read in step.rules.accesses(source, built.scope):
            if step.facts.order(read) > after:
                raise Blocked(
                    read,
                    "RPM114",
                    f"`{source}` is read after the RoundPipe wrap of {model!r} (bound from it before): "
                    f"it would still be the unwrapped module; build the optimizer on `{source}`, or "
                    f"bind `{model} = {source}` after it, then migrate",
                )


def _reject_parallel(step: "StepBuilder", model: str, built: Binding, guard: Optional[cst.CSTNode] = None) -> None:
    """RPM101 for a DDP/DataParallel binding of ``model``, except under ``guard``."""
    for node in step.rules.assignments(model, built.scope):
        call = parallel_call(step.facts, step.facts.statement_of(node), skip=guard)
        if call is not None:
            raise Blocked(
                call,
                "RPM101",
                "DistributedDataParallel/DataParallel model (here or "
                "in the helper this calls): RoundPipe manages devices itself; left untouched",
            )


def local_name_for(step: "StepBuilder", model_outer: str, built: Binding) -> str:
    """The name under which the step's scope sees the model."""
    step_scope = step.facts.scope(step.step_site)
    if step_scope is built.scope or isinstance(built.scope, InstanceFamily):
        return model_outer
    handed = handed_model(step, model_outer, built)  # `Trainer(model, optimizer)`: `self.model`
    if handed is not None:
        return handed
    function = step.facts.function_of(step_scope)
    fed = next(parameters_fed(step.rules, function, model_outer, built.scope), None) if function else None
    if fed is not None:
        _wrapped_parameter(step, function, fed)  # type: ignore[arg-type]
        return fed
    return model_outer


def _wrapped_parameter(step: "StepBuilder", function: cst.FunctionDef, name: str) -> None:
    step.rules.plan.wrapped_models.append((step.facts.scope(function.body.body[0]), name, 0))


def plan_helper_wrap(step: "StepBuilder", built: Binding, model: str) -> None:
    """Wrap ``model``, whose optimizer ``built`` a helper groups, as :func:`plan_model_wrap`
    does; a trainer's model attribute where every construction hands it in, else in
    ``__init__`` right before the optimizer, only where it is built there
    (:func:`~migrate.attributes.check_wrap`)."""
    if isinstance(built.scope, InstanceFamily):
        if plan_handed_wrap(step, built, model, []):  # `self.model = model`: wrapped by the caller
            return
        check_wrap(built.scope, model, built)
    plan_model_wrap(step.rules, built, model, [])


def plan_model_wrap(rules: "TorchAmpRules", built: Binding, model: str, parameter_calls: List[cst.Call]) -> None:
    """Wrap ``model`` with ``roundpipe.RoundPipe`` right before the optimizer ``built`` on
    it, and build that optimizer on ``model.optim_parameters()`` (``parameter_calls``: its
    ``model.parameters()`` calls); once per optimizer statement."""
    plan = rules.plan
    assert built.statement is not None  # an optimizer bound by a statement (origins)
    for call in parameter_calls:
        plan.edits.replace_expression(
            call.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
        )
    if id(built.statement) in plan.wrapped_optimizers:
        return
    plan.wrapped_optimizers.add(id(built.statement))
    config = f"model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch={plan.microbatch})"
    construction = wrap_where_bound(built, model)
    if construction is not None:  # `self.model = roundpipe.RoundPipe(Net(), ...)`
        template = f"roundpipe.RoundPipe(_, {config})"
        plan.edits.replace_expression(construction, lambda updated: wrapped(template, updated))
    else:
        block = rules.facts.parent(built.statement)
        assert isinstance(block, (cst.IndentedBlock, cst.Module))  # a statement's block
        index = list(block.body).index(built.statement)
        wrap = templates.statement(f"{model} = roundpipe.RoundPipe({model}, {config})\n")
        plan.edits.insert_before(block, index, [wrap])
    plan.rewrites.append(
        (built.statement, f"wrapped {model} with roundpipe.RoundPipe; optimizer built on model.optim_parameters()")
    )
    plan.wrapped_models.append((built.scope, model, rules.facts.order(built.statement)))
