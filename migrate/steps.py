"""One training step, recognised and rewritten: the forward region becomes a loss function
for ``forward_backward``, the optimizer statements a step function for ``model.step``.

:class:`StepBuilder` holds the torch.amp shape (``scaler.scale(loss).backward()`` then
``scaler.step``/``update``); the apex rules subclass it. It works for a
:class:`~migrate.torch_amp.TorchAmpRules` instance (``rules``): bindings, the plan, helpers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple, Union

import libcst as cst

from . import joint_steps, multi_step, split_functions, split_step, step_decisions
from .aliases import spellings
from .attributes import InstanceFamily, check_wrap, wrap_where_bound, wrapped
from .ddp_guard import aliased_models, find_ddp_guard, plan_ddp_guard
from .edits import drop_keeping_comments
from .handed_in import handed_model, plan_handed_wrap
from .names import CLIP_FUNCTIONS
from .optimizer_helpers import helper_model, plan_adopting_wrap
from .optimizer_writes import is_scheduler
from .origins import exclusive, origins, parameters_fed
from .parallel import parallel_call
from .plan import Binding, Blocked
from .rules import loss_function, step_function
from .rules.autograd_form import plan_autograd_form
from .rules.loss_function import ForwardPlan, ForwardRegion
from .rules.optimizer_writes import order_optimizer_writes
from .rules.step_function import StepBody, StepGroup
from .step_values import (
    GUARDABLE,
    branches,
    classify_value_statement,
    refuse_step_chosen_by_a_measure,
)
from .syntax import (
    calls_method,
    code,
    dotted,
    method_call,
    names_in,
    only_expression,
    receiver,
)

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["StepBuilder", "StepGroup", "UNFUSABLE", "plan_model_wrap"]

#: Why the forward and the loss cannot move into a loss function: RPM131 (no forward of the
#: recognised shape right before the backward), RPM132 (a starred model call), RPM133 (the
#: backward keeps its graph for a later one), RPM107 (the model called several times, or
#: another backward in the program), RPM113 (work between the forward and the backward that
#: shares their values). A step refused for one of these takes the autograd form instead,
#: which keeps them as written.
UNFUSABLE = frozenset({"RPM107", "RPM113", "RPM131", "RPM132", "RPM133"})
_GUARDABLE: Set[Optional[str]] = set(GUARDABLE)  # step statements an `if` may hold alone


class StepBuilder:
    """Recognises one training step around ``scaler.scale(loss).backward()`` and plans it."""

    def __init__(
        self, rules: "TorchAmpRules", scaler: str, backward: cst.SimpleStatementLine, loss: cst.BaseExpression
    ) -> None:
        self.rules = rules
        self.facts = rules.facts
        self.scaler = scaler
        self.scaler_spellings = spellings(rules.facts, scaler, backward)  # `amp_scaler = state["scaler"]`
        self.anchor = scaler  # the name whose next use after the backward starts the step
        self.step_site: cst.CSTNode = backward  # where the optimizer and model are read (split_functions)
        self.backward = backward
        self.loss = loss
        rules.plan.backward_statements.add(backward)
        block = self.facts.parent(backward)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            raise Blocked(backward, "RPM130", "backward is not a statement of a block")
        self.block: Union[cst.IndentedBlock, cst.Module] = block
        self.body = list(self.block.body)
        self.index = self.body.index(backward)

    # ---------------------------------------------------------------------- plan
    def plan(self) -> None:
        if multi_step.feeds_later_backward(self):
            return
        found = step_function.find_step_group(self)
        if split_step.planned_already(self, found):
            return
        refuse_step_chosen_by_a_measure(self, found)
        if joint_steps.steps_several(self, found):
            joint_steps.plan_joint_steps(self, found)
            return
        group = list(found.statements)
        optimizer = self._optimizer_of(group)
        model = self._model_for(optimizer)
        found = multi_step.own_statements(self, found, optimizer, model)
        group = list(found.statements)
        self.trained = (optimizer, model)
        self.rules.plan.trained_models[self.backward] = model
        if split_step.plan_detached(self, found, optimizer, model):
            return
        if split_functions.plan_detached_function(self, found, optimizer, model):
            return
        try:
            multi_step.check_fusable(self)
            region = loss_function.forward_region(self, model, optimizer)
            forward = loss_function.plan_forward(self, region, model)
        except Blocked as unfused:
            if not self.autograd_form or unfused.code not in UNFUSABLE:
                raise
            plan_autograd_form(self, found, optimizer, model, unfused)
            return
        zero_grads = step_function.zero_grads_to_move(self, region, optimizer, model, found)
        loss_function.emit_forward(self, region, forward)
        self.fused_form_planned(region, zero_grads, forward)
        step_function.plan_step_group(self, found, optimizer, model, zero_grads)
        self.rules.plan.edits.replace_range(self.block, self.index, self.index + 1, drop_keeping_comments)
        if not self.rules.exact:  # a synchronous step has finished when model.step returns
            forward_statements = region.with_statement or region.statements[region.start : region.end]
            skipped: Set[cst.CSTNode] = {*group, self.backward, *region.outside}
            skipped |= {forward_statements} if isinstance(forward_statements, cst.With) else set(forward_statements)
            order_optimizer_writes(self, skipped, optimizer, model)

    # ------------------------------------------------ hooks of the step's shape
    def fused_form_planned(self, region: ForwardRegion, zero_grads: List[int], forward: ForwardPlan) -> None:
        """Called once the loss function for ``forward`` (found in ``region``; the
        ``zero_grads`` move into the step function) is planned: for the shapes that track
        where their steps start (apex)."""

    def holds_model(self, node: cst.BaseExpression, model: str) -> bool:
        """``node`` spells ``model`` in a way of this shape's own, besides the names the
        rules follow (apex: a model held on ``self``, compared by source text)."""
        return False

    def shape_edits(self, statement: cst.BaseStatement, kind: Optional[str], optimizer: str) -> None:
        """Edits of this shape to a step statement of ``kind``, besides those every step
        gets (:func:`~migrate.rules.step_function.group_edits`)."""

    def _step_body(self, updated: List[cst.BaseStatement], kinds: List[Optional[str]], optimizer: str) -> StepBody:
        """(statements for the step function, the main-thread update) from the step group."""
        return step_function.split_update(updated, kinds)

    def step_group_after(
        self, block: Union[cst.IndentedBlock, cst.Module], body: List[cst.BaseStatement], after: int
    ) -> Tuple[Optional[StepGroup], bool]:
        """See :func:`migrate.rules.step_function.step_group_after` (for the modules that
        find a step group in another method or function)."""
        return step_function.step_group_after(self, block, body, after)

    autograd_form = True  # a step whose forward cannot be fused keeps it (torch.amp shapes)
    orders_optimizer_writes = True  # False where another rule orders them (a wrapper's two-path step)
    step_rewrite = "optimizer step -> model.step(step_fn); scaler.update() kept"

    def plan_autograd_form(self, found: StepGroup, optimizer: str, model: str, unfused: Blocked) -> None:
        """See :func:`migrate.rules.autograd_form.plan_autograd_form` (for the modules that
        plan a step found in another method or function, or one of several steps)."""
        plan_autograd_form(self, found, optimizer, model, unfused)

    # ------------------------------------------------------------ the step group
    def _classify(self, statement: cst.BaseStatement) -> Optional[str]:
        value_kind = classify_value_statement(self, statement)  # grad norms, `if clip: ... else: ...`
        if value_kind is not None:
            return value_kind
        if (
            isinstance(statement, cst.If)
            and statement.orelse is None
            and isinstance(statement.body, cst.IndentedBlock)
            and all(self._classify(inner) in _GUARDABLE for inner in statement.body.body)
        ):
            return "guarded"  # `if grad_clip: scaler.unscale_(opt); clip...(...)`
        if step_decisions.is_decided(self, statement):
            return "decided"  # `if not torch.isfinite(grad_norm): ...` around or before the step
        value = only_expression(statement)
        if not isinstance(value, cst.Call):
            return None
        for s in self.scaler_spellings:
            if method_call(value, s, "unscale_"):
                return "unscale"
            if method_call(value, s, "step"):
                return "step"
            if method_call(value, s, "update"):
                return "update"
        if self.facts.calls_any(value, CLIP_FUNCTIONS):
            return "clip"
        owner = self.rules.reference(value.func.value) if isinstance(value.func, cst.Attribute) else None
        if owner is not None and calls_method(value, "zero_grad"):
            return "zero_grad"
        if owner is not None and calls_method(value, "step"):
            if self._is_scheduler(owner, statement):
                return "scheduler"
        return None

    def _with_kinds(self, group: List[cst.BaseStatement]) -> List[Tuple[cst.BaseStatement, Optional[str]]]:
        """The step group's statements with their kinds, a guarded ``if`` followed by the
        statements of its body."""
        found: List[Tuple[cst.BaseStatement, Optional[str]]] = []
        for statement in group:
            kind = self._classify(statement)
            found.append((statement, kind))
            if kind in ("guarded", "decided") and isinstance(statement, cst.If):
                found += [(inner, self._classify(inner)) for part in branches(statement) for inner in part]
        return found

    def _is_scheduler(self, name: str, at: cst.CSTNode) -> bool:
        return is_scheduler(self.rules, name, at)

    def ends_function(self, function: cst.FunctionDef) -> bool:
        """The backward is a statement of ``function``'s own body with only ``return`` lines
        after it (its step, if any, is in another function or method)."""
        after = self.body[self.index + 1 :]
        return self.block is function.body and all(
            isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return) for s in after
        )

    def _mentions(self, node: cst.CSTNode, name: str) -> bool:
        if name == self.scaler and len(self.scaler_spellings) > 1:
            return any(self._mentions_spelling(node, spelling) for spelling in self.scaler_spellings)
        return self._mentions_spelling(node, name)

    def _mentions_spelling(self, node: cst.CSTNode, name: str) -> bool:
        if "." in name or "[" in name:  # an instance attribute (`self.scaler`), a state's field
            return any(dotted(a) == name for a in self.facts.subtree(node, (cst.Attribute, cst.Subscript)))
        return name in names_in(node)

    def _optimizer_of(self, group: List[cst.BaseStatement]) -> str:
        kinds = step_decisions.decision_kinds(self, group)
        if kinds.count("step") != 1 or kinds.count("update") > 1:
            raise multi_step.unsupported_group(self, group, kinds)
        if "update" in kinds and kinds.index("update") < kinds.index("step"):
            raise Blocked(group[0], "RPM134", "scaler.update() before scaler.step()")
        step_call = only_expression(next(s for s, kind in self._with_kinds(group) if kind == "step"))
        assert isinstance(step_call, cst.Call)  # what _classify calls a step
        optimizer = self.rules.reference(step_call.args[0].value) if len(step_call.args) == 1 else None
        if optimizer is None and len(step_call.args) > 1:
            raise Blocked(step_call, "RPM102", "scaler.step() with extra arguments (e.g. a closure) is not migrated")
        if optimizer is None:
            raise Blocked(
                step_call, "RPM106", "scaler.step() is not given one optimizer by name or attribute; not migrated"
            )
        if "update" not in kinds:  # one of several steps sharing the scaler (a GAN)
            multi_step.require_update_later(self, group, optimizer)
        for statement, kind in self._with_kinds(group):
            call = only_expression(statement)
            if (
                kind == "unscale"
                and isinstance(call, cst.Call)  # what _classify calls an unscale is
                and dotted(call.args[0].value if call.args else None) != optimizer
            ):
                raise Blocked(call, "RPM107", "unscale_() of another optimizer")
        return optimizer

    def _model_for(self, optimizer: str) -> str:
        """The model's name in the step's scope; plans the wrap and the optimizer rewrite
        for every place the step's optimizer is built (a training function called for two
        models wraps each)."""
        self.builds: List[Tuple[Binding, str]] = []
        local_names: Set[str] = set()
        for built in origins(self.rules, optimizer, self.step_site):
            model_outer, local = self._model_built_with(built)
            if any(
                b.scope is built.scope
                and outer == model_outer
                and not exclusive(self.facts, b.statement, built.statement)  # type: ignore[arg-type]
                for b, outer in self.builds
            ):
                raise Blocked(
                    built.statement or self.backward,
                    "RPM107",
                    f"the model {model_outer!r} is trained with several optimizers through one step",
                )
            self.builds.append((built, model_outer))
            local_names.add(self._through_state(optimizer, built, model_outer) or local)
        if len(local_names) != 1:
            raise Blocked(self.backward, "RPM107", "the step trains models it sees under different names")
        self.built, self.model_outer = self.builds[0]
        return local_names.pop()

    def _through_state(self, optimizer: str, built: Binding, model: str) -> Optional[str]:
        """The step's reference to the model when it reads the optimizer through a state
        object (``state.optimizer`` -> ``state.model``, see :mod:`migrate.state_objects`)."""
        states = self.rules.state_objects
        found = states.lookup(optimizer, self.backward)
        if found is None:
            return None
        build = found[0]
        statement = built.statement
        if (
            statement is None
            or self.facts.scope(build) is not built.scope
            or self.facts.order(build) < self.facts.order(statement)
        ):
            raise Blocked(
                build,
                "RPM125",
                f"the state object is built before (or away from) its optimizer {optimizer!r}: it would "
                "hold the model unwrapped; left untouched",
            )
        return states.model_reference(optimizer, model, self.backward)

    def _model_built_with(self, built: Binding) -> Tuple[str, str]:
        """(the model's name where ``built`` builds the optimizer, its name in the step's
        scope); plans the wrap and the optimizer rewrite."""
        if not isinstance(built.value, cst.Call):
            raise Blocked(
                built.statement or self.backward,
                "RPM108",
                f"optimizer {built.name or code(built.value or cst.Name('?'))!r} is not built by a call in this file",
            )
        parameter_calls = [
            call
            for call in self.facts.subtree(built.value, cst.Call)
            if calls_method(call, "parameters") and not call.args and self.rules.reference(receiver(call))
        ]
        owners = {owner for call in parameter_calls if (owner := self.rules.reference(receiver(call)))}
        if len(owners) > 1:
            optimizer = built.name or code(built.value)
            raise Blocked(built.value, "RPM108", multi_step.several_models_message(optimizer, owners))
        if not owners:  # `create_optimizer(model, cfg)`: a helper groups the parameters
            found = helper_model(self, built)
            if found is not None:
                model_outer, local = found
                self._reject_parallel(model_outer, built)
                plan_adopting_wrap(self, built, model_outer)
                return model_outer, local
        if len(owners) != 1:
            raise Blocked(
                built.value,
                "RPM108",
                "the optimizer is not built on "
                "`model.parameters()` of one model (parameter groups of submodules "
                "cannot be mapped to RoundPipe's optimizer copies)",
            )
        model_outer = owners.pop()
        if "." in model_outer and not isinstance(built.scope, InstanceFamily):
            raise Blocked(
                built.value, "RPM108", f"the optimizer is built on {model_outer!r} outside its class's own attributes"
            )
        guard, aliases = None, set()  # DDP guards and aliases are followed for names only
        if isinstance(built.scope, InstanceFamily):
            if plan_handed_wrap(self, built, model_outer, parameter_calls):  # `Trainer(model)`: wrapped there
                return model_outer, model_outer
            check_wrap(built.scope, model_outer, built)
        else:
            guard = find_ddp_guard(self.facts, built, model_outer)  # `if args.distributed: model = DDP(model)`
            model_outer = guard.model if guard is not None else model_outer
            aliases = aliased_models(self.facts, built, model_outer)
        for trained in {model_outer, *aliases}:
            self._reject_parallel(trained, built, guard.statement if guard is not None else None)
        self._plan_wrap(built, model_outer, parameter_calls)
        if guard is not None:
            plan_ddp_guard(self, built, guard)
        return model_outer, self._local_name_for(model_outer, built)

    def _reject_parallel(self, model: str, built: Binding, guard: Optional[cst.CSTNode] = None) -> None:
        """RPM101 for a DDP/DataParallel binding of ``model``, except under ``guard``."""
        for node in self.rules._assignments(model, built.scope):
            call = parallel_call(self.facts, self.facts.statement_of(node), skip=guard)
            if call is not None:
                raise Blocked(
                    call,
                    "RPM101",
                    "DistributedDataParallel/DataParallel model (here or "
                    "in the helper this calls): RoundPipe manages devices itself; left untouched",
                )

    def _local_name_for(self, model_outer: str, built: Binding) -> str:
        """The name under which the step's scope sees the model."""
        step_scope = self.facts.scope(self.step_site)
        if step_scope is built.scope or isinstance(built.scope, InstanceFamily):
            return model_outer
        handed = handed_model(self, model_outer, built)  # `Trainer(model, optimizer)`: `self.model`
        if handed is not None:
            return handed
        function = self.facts.function_of(step_scope)
        fed = next(parameters_fed(self.rules, function, model_outer, built.scope), None) if function else None
        if fed is not None:
            self._wrapped_parameter(function, fed)  # type: ignore[arg-type]
            return fed
        return model_outer

    def _wrapped_parameter(self, function: cst.FunctionDef, name: str) -> None:
        self.rules.plan.wrapped_models.append((self.facts.scope(function.body.body[0]), name, 0))

    def _plan_wrap(self, built: Binding, model: str, parameter_calls: List[cst.Call]) -> None:
        plan_model_wrap(self.rules, built, model, parameter_calls)

    # ---------------------------------------------------------- forward region
    def _zero_grad_call(self, statement: cst.BaseStatement, optimizer: str, model: str) -> bool:
        call = only_expression(statement)
        return call is not None and (method_call(call, optimizer, "zero_grad") or method_call(call, model, "zero_grad"))

    @staticmethod
    def _model_calls(statement: cst.CSTNode, model: str) -> List[cst.Call]:
        calls: List[cst.Call] = []

        class Find(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                if dotted(call.func) == model:
                    calls.append(call)

        statement.visit(Find())
        return calls

    def _fresh(self, base: str) -> str:
        return self.rules.plan.fresh(base)


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
        wrap = cst.parse_statement(f"{model} = roundpipe.RoundPipe({model}, {config})\n")
        plan.edits.insert_before(block, index, [wrap])
    plan.rewrites.append(
        (built.statement, f"wrapped {model} with roundpipe.RoundPipe; optimizer built on model.optim_parameters()")
    )
    plan.wrapped_models.append((built.scope, model, rules.facts.order(built.statement)))
