"""One training step, recognised and rewritten: the forward region becomes a loss function
for ``forward_backward``, the optimizer statements a step function for ``model.step``.

:class:`StepBuilder` holds the torch.amp shape (``scaler.scale(loss).backward()`` then
``scaler.step``/``update``); the apex rules subclass it. It works for a
:class:`~migrate.torch_amp.TorchAmpRules` instance (``rules``): bindings, the plan, helpers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, List, Optional, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import BuiltinAssignment, Scope

from . import joint_steps, multi_step, optimizer_wrappers, split_functions, split_step, step_decisions
from .aliases import spellings
from .attributes import InstanceFamily, check_wrap, instance_places, wrap_where_bound, wrapped
from .ddp_guard import aliased_models, earlier_in_sync_blocks, find_ddp_guard, is_sync_context, plan_ddp_guard
from .edits import carry_comments, drop_keeping_comments
from .handed_in import handed_model, plan_handed_wrap
from .names import CLIP_FUNCTIONS
from .optimizer_helpers import helper_model, plan_adopting_wrap
from .optimizer_writes import is_scheduler, optimizer_writes
from .origins import INLINE, exclusive, origins, parameters_fed
from .parallel import parallel_call
from .plan import Binding, Blocked
from .step_values import (
    GUARDABLE,
    branches,
    classify_value_statement,
    escaping_values,
    on_copies,
    refuse_step_chosen_by_a_measure,
)
from .syntax import (
    assigned_names,
    calls_method,
    code,
    dotted,
    is_assignment_line,
    is_plain_line,
    method_call,
    names_in,
    names_outside,
    only_assignment,
    only_expression,
    receiver,
    statements_of,
    written_and_read,
)

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["StepBuilder", "ForwardRegion", "ForwardPlan", "StepGroup", "UNFUSABLE", "plan_model_wrap"]

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
        found = self._find_step_group()
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
            region = self._forward_region(model, optimizer)
            forward = self._plan_forward(region, model)
        except Blocked as unfused:
            if not self.autograd_form or unfused.code not in UNFUSABLE:
                raise
            self._plan_autograd_form(found, optimizer, model, unfused)
            return
        zero_grads = self._zero_grads_to_move(region, optimizer, model, found)
        self._emit_forward(region, forward)
        self._plan_step_group(found, optimizer, model, zero_grads)
        self.rules.plan.edits.replace_range(self.block, self.index, self.index + 1, drop_keeping_comments)
        if not self.rules.exact:  # a synchronous step has finished when model.step returns
            forward_statements = region.with_statement or region.statements[region.start : region.end]
            skipped: Set[cst.CSTNode] = {*group, self.backward, *region.outside}
            skipped |= {forward_statements} if isinstance(forward_statements, cst.With) else set(forward_statements)
            self._order_optimizer_writes(skipped, optimizer, model)

    autograd_form = True  # a step whose forward cannot be fused keeps it (torch.amp shapes)
    step_rewrite = "optimizer step -> model.step(step_fn); scaler.update() kept"

    def _plan_autograd_form(self, found: "StepGroup", optimizer: str, model: str, unfused: Blocked) -> None:
        """RoundPipe's autograd form (design/MIGRATE.md, "Two target forms"): the forward,
        the loss code and ``scaler.scale(loss).backward()`` stay on the main thread as
        written (RoundPipe's forward is differentiable; the backward accumulates the
        gradients that ``model.step`` hands to the optimizer copies); only the optimizer
        work moves into the step function."""
        zero_grads = [p for p in range(self.index) if self._zero_grad_call(self.body[p], optimizer, model)]
        if zero_grads:
            self._require_every_iteration(self.body[zero_grads[0]], found)
        self._plan_step_group(found, optimizer, model, zero_grads)
        self.rules.plan.rewrites.append(
            (
                self.backward,
                "autograd form: forward, loss code and backward "
                f"kept on the main thread (not fused: {unfused.message})",
            )
        )
        if not self.rules.exact:
            self._order_optimizer_writes({*found.statements, self.backward}, optimizer, model)

    def _order_optimizer_writes(self, skipped: Set[cst.CSTNode], optimizer: str, model: str) -> None:
        """Main-thread writes of optimizer state (lr loops, scheduler steps, helpers given the
        optimizer) in the step's function, and after the wrap where the optimizer is built,
        wait for the running step first (``model.synchronize()`` before them); the
        ``skipped`` statements are the step's own."""
        function = self.facts.enclosing(self.backward, (cst.FunctionDef,))
        trainer = function.name.value if isinstance(function, cst.FunctionDef) else None
        trainers = {trainer} if trainer else set()
        places: List[Tuple[cst.CSTNode, str, str, Optional[List[cst.CSTNode]]]] = [
            (function or self.facts.module, optimizer, model, [self.backward])
        ]
        builds: List[Tuple[Binding, str]] = getattr(self, "builds", [])
        states = self.rules.state_objects
        for built, model_outer in builds:
            if isinstance(built.scope, InstanceFamily):
                places = instance_places(built.scope, function, self.backward, optimizer, model)
            if built.scope is self.facts.scope(self.backward) or not trainer or built.name == INLINE:
                continue
            scope = built.scope
            root: cst.CSTNode = (
                self.facts.function_of(scope) if isinstance(scope, Scope) else None
            ) or self.facts.module
            # `train(...)`, or `t.train_step(...)` for a method (a trainer built with the objects)
            calls = list(m.findall(root, m.Call(func=m.Name(trainer) | m.Attribute(attr=m.Name(trainer)))))
            places.append((root, built.name, model_outer, calls))
        # a state object's optimizer: every function holding the state may write it anytime
        places += [(root, name, held, None) for root, name, held in states.places(optimizer, model, self.backward)]
        # `opt = optimizer`: writes through an alias bound once in the step's scope
        places += [
            (function or self.facts.module, alias, model, [self.backward])
            for alias in sorted(spellings(self.facts, optimizer, self.backward) - {optimizer})
        ]
        for root, name, model_name, anchors in places:

            def its_scheduler(owner: str, at: cst.CSTNode, name: str = name) -> bool:
                return self._is_scheduler(owner, at) and multi_step.schedules(self, owner, at, name)

            for statement in optimizer_writes(self.facts, root, name, its_scheduler, skipped, trainers):
                if anchors is None or any(self._may_run_after(statement, anchor) for anchor in anchors):
                    self.rules.plan.synchronize_before.append((statement, model_name))

    def _may_run_after(self, statement: cst.CSTNode, anchor: cst.CSTNode) -> bool:
        """``statement`` comes after ``anchor`` in source order, or shares a loop with it."""
        if self.facts.order(statement) > self.facts.order(anchor):
            return True
        loops = {id(a) for a in self.facts.ancestors(anchor) if isinstance(a, (cst.For, cst.While))}
        return any(id(a) in loops for a in self.facts.ancestors(statement))

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

    def _find_step_group(self) -> "StepGroup":
        """The optimizer step statements: the first contiguous run of step statements after
        the backward, in this block or in the body of an ``if`` (gradient accumulation)
        that follows it; when the backward ends the body of a loop of micro-steps (nothing
        after it uses the scaler), the same after that loop."""
        block, body, after = self.block, self.body, self.index
        while True:
            found, stopped = self._step_group_after(block, body, after)
            if found is not None:
                return found
            loop = self.facts.parent(block)
            climbable = isinstance(loop, (cst.For, cst.While)) and loop.orelse is None
            if stopped or not (climbable or is_sync_context(self.facts, loop)):  # no_sync/nullcontext block
                break
            outer = self.facts.parent(loop)
            if not isinstance(outer, (cst.IndentedBlock, cst.Module)):
                break
            block, body = outer, list(outer.body)
            assert isinstance(loop, (cst.For, cst.While, cst.With))  # climbable, or a no_sync/nullcontext block
            after = body.index(loop)
        function = self.facts.enclosing(self.backward, (cst.FunctionDef,))
        wrapper = (
            optimizer_wrappers.split_step_reason(self, function) if isinstance(function, cst.FunctionDef) else None
        )
        detached = None if wrapper else split_step.detached_group(self)  # the optimizer work in another method
        detached = detached or (None if wrapper else split_functions.detached_function_group(self))
        if detached is not None:  # (an optimizer wrapper's methods are called in turn: no one step to move)
            return detached
        raise Blocked(
            self.backward,
            "RPM106",
            "no optimizer step (`scaler.step(optimizer)` + "
            "`scaler.update()`, or apex's `optimizer.step()`) follows the backward in "
            f"the same block{self._split_over_functions(function, wrapper)}",
        )

    def ends_function(self, function: cst.FunctionDef) -> bool:
        """The backward is a statement of ``function``'s own body with only ``return`` lines
        after it (its step, if any, is in another function or method)."""
        after = self.body[self.index + 1 :]
        return self.block is function.body and all(
            isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return) for s in after
        )

    def _split_over_functions(self, function: Optional[cst.CSTNode], wrapper: Optional[str]) -> str:
        """Why no step follows, when the backward ends its ``function`` (nothing but a
        ``return`` after it): the step is in another function or method (mixins), or
        ``wrapper`` (:func:`optimizer_wrappers.split_step_reason`) says why not."""
        if not isinstance(function, cst.FunctionDef) or not self.ends_function(function):
            return ""
        if wrapper is not None:
            return wrapper
        return (
            f" ({function.name.value}() ends with it: a step split over several functions or "
            "methods, e.g. backward and update mixins, is not migrated)"
        )

    def _step_group_after(
        self, block: Union[cst.IndentedBlock, cst.Module], body: List[cst.BaseStatement], after: int
    ) -> Tuple[Optional["StepGroup"], bool]:
        """The step group among ``body[after + 1:]``; ``True`` with None when a statement
        there uses the scaler without being one."""
        for position in range(after + 1, len(body)):
            statement = body[position]
            found = self._step_run(block, body, position, None)
            if found is not None:
                return found, True
            if isinstance(statement, cst.If) and self._mentions(statement, self.anchor):
                if statement.orelse is not None:
                    raise Blocked(statement, "RPM135", "conditional optimizer step with an else branch")
                inner: List[cst.BaseStatement] = list(statement.body.body)  # type: ignore[arg-type]
                for inner_position in range(len(inner)):
                    found = self._step_run(statement.body, inner, inner_position, statement)
                    if found is not None:
                        return found, True
            if self._mentions(statement, self.anchor):
                return None, True
        return None, False

    def _step_run(
        self, block: cst.CSTNode, statements: List[cst.BaseStatement], start: int, condition: Optional[cst.If]
    ) -> Optional["StepGroup"]:
        if self._classify(statements[start]) is None:
            return None
        end = start
        while end < len(statements) and self._classify(statements[end]) is not None:
            end += 1
        return StepGroup(block, start, end, tuple(statements[start:end]), condition)

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

    def _forward_region(self, model: str, optimizer: str) -> "ForwardRegion":
        end = self.index
        while end > 0 and self._zero_grad_call(self.body[end - 1], optimizer, model):
            end -= 1  # zero_grad() between loss and backward: moved into the step function
        self.zero_before_backward = list(range(end, self.index))
        if end == 0:
            raise Blocked(self.backward, "RPM131", "no forward pass before the backward")
        previous = self.body[end - 1]
        if isinstance(previous, cst.With):
            if not all(self.facts.is_autocast(item) for item in previous.items):
                raise Blocked(previous, "RPM131", "forward inside a `with` block that is not autocast")
            inner = statements_of(previous.body)
            start = self._model_statement(inner, model, previous)
            return ForwardRegion(previous.body, inner, start, len(inner), previous, end - 1)
        split = self._split_region(model, end)
        if split is not None:
            return split
        start = self._model_statement(self.body[:end], model, self.backward)
        return ForwardRegion(self.block, self.body, start, end, None, start)

    def _split_region(self, model: str, end: int) -> Optional["ForwardRegion"]:
        """Forward inside ``with autocast(...)``, loss computed after the block (outside
        autocast): the outside statements run in the loss function with autocast disabled."""
        position = end - 1
        while (
            position >= 0 and is_plain_line(self.body[position]) and not self._model_calls(self.body[position], model)
        ):
            position -= 1
        if position < 0 or position == end - 1 or not isinstance(self.body[position], cst.With):
            return None
        with_statement = cst.ensure_type(self.body[position], cst.With)
        if len(with_statement.items) != 1 or not self.facts.is_autocast(with_statement.items[0]):
            return None
        inner = statements_of(with_statement.body)
        start = self._model_statement(inner, model, with_statement)
        region = ForwardRegion(with_statement.body, inner, start, len(inner), with_statement, position)
        region.outside = self.body[position + 1 : end]
        region.outside_range = (position + 1, end)
        return region

    def _model_statement(self, statements: List[cst.BaseStatement], model: str, at: cst.CSTNode) -> int:
        position = len(statements) - 1
        while position >= 0 and is_plain_line(statements[position]):
            if self._model_calls(statements[position], model):
                return position
            position -= 1
        raise Blocked(
            at,
            "RPM131",
            f"the forward pass (a call of {model!r} followed only by "
            "simple statements computing the loss) was not found before the backward",
        )

    @staticmethod
    def _model_calls(statement: cst.CSTNode, model: str) -> List[cst.Call]:
        calls: List[cst.Call] = []

        class Find(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                if dotted(call.func) == model:
                    calls.append(call)

        statement.visit(Find())
        return calls

    def _zero_grads_to_move(self, region: "ForwardRegion", optimizer: str, model: str, found: "StepGroup") -> List[int]:
        """Indices in this block of `optimizer/model.zero_grad()` before the backward (at the
        top of the iteration, or between loss and backward): they move to the step's end."""
        found_at = [p for p in range(region.outer_index) if self._zero_grad_call(self.body[p], optimizer, model)]
        found_at += self.zero_before_backward
        if found_at:
            self._require_every_iteration(self.body[found_at[0]], found)
        return found_at

    def _require_every_iteration(self, zero_grad: cst.BaseStatement, found: "StepGroup") -> None:
        """A ``zero_grad()`` before the backward moves to the step's end only when the step
        runs in every iteration that zeroes (not under a condition, nor after a loop of
        micro-steps): otherwise the zeroing would no longer discard the gradients between."""
        if found.block is not self.block:
            raise Blocked(
                zero_grad,
                "RPM135",
                "zero_grad() every iteration but an optimizer step "
                "under a condition or after a loop; not certain, left untouched",
            )

    # ------------------------------------------------------------- emit: forward
    def _plan_forward(self, region: "ForwardRegion", model: str) -> "ForwardPlan":
        """The forward + loss as the loss function will hold them (nothing emitted yet)."""
        statements = region.statements[region.start : region.end] + region.outside
        model_calls = [c for s in statements for c in self._model_calls(s, model)]
        if len(model_calls) != 1:
            raise Blocked(
                statements[0], "RPM107", f"{model!r} is called {len(model_calls)} times in the forward; not migrated"
            )
        model_call = model_calls[0]
        first = statements[0]
        output_name, drop_first = self._output_binding(first, model_call)
        loss_name = self.loss.value if isinstance(self.loss, cst.Name) else None
        moved = self._loss_slice(statements, output_name)
        moved_statements = [s for s, inside in zip(statements, moved) if inside]
        outside_names = self._names_outside(moved_statements)
        assigned = {n for s in moved_statements for n in written_and_read(s)[0]}
        self._check_kept(statements, moved, assigned, {loss_name, output_name})
        self._check_scaler_bound_before(statements)
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
        labels = self._labels(region, moved_statements, model_call, assigned, kept)
        self._check_locals(moved_statements, {output_name or "", *labels})
        input_args, input_kwargs = self._inputs(model_call)
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
            sum_reduced=self._sum_reduced(moved_statements),
            moved=tuple(moved),
        )

    def _loss_slice(self, statements: List[cst.BaseStatement], output_name: Optional[str]) -> List[bool]:
        """Which forward-region statements the loss depends on (they move into the loss
        function): the model call, and walking backwards every statement binding a name
        that a later moved statement (or the loss) reads. The rest keeps its place."""
        needed = set(names_in(self.loss))
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
        self, statements: List[cst.BaseStatement], moved: List[bool], assigned: Set[str], available: Set[Optional[str]]
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

    def _check_scaler_bound_before(self, statements: List[cst.BaseStatement]) -> None:
        """The loss function returns ``scaler.scale(loss)``: a statement of the forward
        region binding the scaler's name (``scaler = state["scaler"]`` after the forward)
        would run after the loss function reads it."""
        root = self.scaler.partition(".")[0].partition("[")[0]
        for statement in statements:
            if root in written_and_read(statement)[0]:
                raise Blocked(
                    statement,
                    "RPM113",
                    f"this statement between the forward and the backward binds {root!r}, which scales the loss; "
                    "the loss function would read it before it is bound; not migrated",
                )

    def _check_locals(self, moved: List[cst.BaseStatement], parameters: Set[str]) -> None:
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

    def _names_outside(self, moved: List[cst.BaseStatement]) -> Set[str]:
        """Names used in the step's function (or module) outside the moved statements."""
        scope_node = self.facts.enclosing(self.backward, (cst.FunctionDef,)) or self.facts.module
        return names_outside(self.facts, scope_node, set(moved))

    def _sum_reduced(self, statements: List[cst.BaseStatement]) -> bool:
        """The loss sums over the batch (``reduction="sum"`` in it or in its criterion):
        then per-microbatch losses already add up and are not divided."""

        def says_sum(node: cst.CSTNode) -> bool:
            return bool(
                m.findall(
                    node, m.Arg(keyword=m.Name("reduction"), value=m.SimpleString('"sum"') | m.SimpleString("'sum'"))
                )
            )

        for statement in statements:
            if says_sum(statement):
                return True
            for call in m.findall(statement, m.Call(func=m.Name())):
                assert isinstance(call, cst.Call) and isinstance(call.func, cst.Name)  # as matched
                try:
                    binding = self.rules._binding(call.func.value, statement)
                except Blocked:
                    continue
                if binding.value is not None and says_sum(binding.value):
                    return True
        return False

    def _output_binding(self, first: cst.BaseStatement, model_call: cst.Call) -> Tuple[Optional[str], bool]:
        small = only_assignment(first)
        if small is not None and small.value is model_call and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name):
                return target.value, True
        return None, False

    def _next_batch_names(self, model_call: cst.Call, kept: List[cst.BaseStatement]) -> Set[str]:
        """Names bound, after the forward, by the statement that fetches the next batch (the
        one that rebinds the model's inputs, ``x, y = next(it)``): this iteration's data too."""
        loop = self.facts.enclosing(self.backward, (cst.For, cst.While, cst.FunctionDef))
        if not isinstance(loop, (cst.For, cst.While)):
            return set()
        inputs = set(names_in(model_call))
        names: Set[str] = set()
        for statement in [*kept, *self.body[self.index + 1 :]]:
            written = written_and_read(statement)[0] if is_assignment_line(statement) else set()
            if written & inputs:
                names |= written
        return names

    def _batch_names(self, region: "ForwardRegion") -> Set[str]:
        """Names holding this iteration's data: the loop target and everything assigned in
        the loop body before the forward; without a loop, the function's parameters. A
        loss input among them is a label (split with the microbatches); anything else the
        loss reads is captured by the loss function as it is."""
        loop = self.facts.enclosing(self.backward, (cst.For, cst.While, cst.FunctionDef))
        names: Set[str] = set()
        if isinstance(loop, (cst.For, cst.While)):
            if isinstance(loop, cst.For):
                names |= set(names_in(loop.target))
            earlier = earlier_in_sync_blocks(self.facts, self.block) + self.body[: region.outer_index]
            if region.with_statement is not None:
                earlier = earlier + region.statements[: region.start]
            for statement in earlier:
                if is_assignment_line(statement):
                    names |= set(assigned_names(statement))
        elif isinstance(loop, cst.FunctionDef):
            names |= {p.name.value for p in loop.params.params}
            names -= {self.rules.attributes.receiver_of(loop)}  # `self` is no batch data
        return names

    def _labels(
        self,
        region: "ForwardRegion",
        statements: List[cst.BaseStatement],
        model_call: cst.Call,
        assigned: Set[str],
        kept: List[cst.BaseStatement],
    ) -> List[str]:
        batch = self._batch_names(region) | self._next_batch_names(model_call, kept)
        free: List[str] = []
        for statement in statements:
            for name in names_in(statement):
                if name in batch and name not in assigned and name not in free:
                    free.append(name)
        inputs = set(names_in(model_call))
        return [n for n in free if n not in inputs or self._used_outside_call(statements, model_call, n)]

    def _used_outside_call(self, statements, model_call, name) -> bool:
        total = sum(names_in(s).count(name) for s in statements)
        return total > names_in(model_call).count(name)

    @staticmethod
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

    def _emit_forward(self, region: "ForwardRegion", forward: "ForwardPlan") -> None:
        plan = self.rules.plan
        loss_fn = self._fresh("_loss_fn")
        labels = list(forward.labels)
        out_param = forward.output_name or self._fresh("_outputs")
        label_param = labels[0] if len(labels) == 1 else self._fresh("_labels" if labels else "_label")
        if forward.output_name is None:
            plan.edits.replace_expression(forward.model_call, lambda _: cst.Name(out_param))
        divisor = "" if forward.sum_reduced else f" / {plan.microbatch}"
        head = f"    {', '.join(labels)} = {label_param}\n" if len(labels) > 1 else ""
        call_text = f"{forward.model}.forward_backward({self._call_arguments(forward, labels)}, loss_fn={loss_fn}"
        call_text += ", return_outputs=True)[1]" if forward.return_outputs else ")"
        # The loss is logged as the loss function saw it, unscaled: dividing the returned
        # (scaled) sum by the scale would give inf once loss * scale overflows.
        scope = self.facts.scope(forward.model_call)
        logged = forward.loss_name if forward.loss_name and self._read_elsewhere(region, forward) else None
        if logged and scope is not None and any(not isinstance(a, BuiltinAssignment) for a in scope["sum"]):
            raise Blocked(
                forward.model_call,
                "RPM137",
                "the file binds its own `sum`, which the "
                "migrated loss logging (`loss = sum(_losses)`) needs as the builtin; "
                "not migrated",
            )
        losses = self._fresh("_losses") if logged else None
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
        outside = self._outside_autocast(region, [s for s, keep in zip(region.outside, outside_moved) if keep])
        returned = cst.parse_statement(f"return {self.scaler}.scale({code(self.loss)}){divisor}\n")
        drop = 1 if forward.drop_first else 0

        def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
            body = [s for s, keep in list(zip(updated, inside_moved))[drop:] if keep] + outside
            kept = [s for s, keep in zip(updated, inside_moved) if not keep]
            definition = cst.parse_statement(f"def {loss_fn}({out_param}, {label_param}):\n{head}    pass\n")
            assert isinstance(definition, cst.FunctionDef) and isinstance(definition.body, cst.IndentedBlock)
            inner = [*definition.body.body[:-1], *body, *map(cst.parse_statement, capture), returned]
            definition = definition.with_changes(body=definition.body.with_changes(body=inner))
            return [carry_comments(updated[:drop], definition), *map(cst.parse_statement, after), *kept]

        plan.edits.replace_range(region.block, region.start, region.end, build)
        if region.outside:  # the moved statements carry their own comments
            plan.edits.replace_range(
                self.block,
                *region.outside_range,
                lambda updated: [s for s, keep in zip(updated, outside_moved) if not keep],
            )
        plan.rewrites.append((forward.model_call, "forward + loss -> model.forward_backward(loss_fn=...)"))

    def _read_elsewhere(self, region: "ForwardRegion", forward: "ForwardPlan") -> bool:
        """The loss variable is used besides the forward and the backward (or is a global,
        which any code may read): only then does the migrated code rebuild it."""
        function = self.facts.enclosing(self.backward, (cst.FunctionDef,))
        if function is None:
            return True
        statements = region.statements[region.start : region.end] + region.outside
        skipped: Set[cst.CSTNode] = {s for s, inside in zip(statements, forward.moved) if inside}
        skipped.add(self.backward)
        return bool({forward.loss_name, "locals", "vars"} & names_outside(self.facts, function, skipped))

    @staticmethod
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
        self, region: "ForwardRegion", statements: List[cst.BaseStatement]
    ) -> List[cst.BaseStatement]:
        """``with <the same autocast>(<its device>, enabled=False): <statements>`` for loss
        statements that ran after the autocast block, so they keep running outside it."""
        if not statements or region.with_statement is None:
            return []
        call = cst.ensure_type(region.with_statement.items[0].item, cst.Call)  # an autocast(...) call
        legacy = self.facts.calls_any(
            call, {"torch.cuda.amp.autocast", "torch.cpu.amp.autocast", "torch.cuda.amp.autocast_mode.autocast"}
        )
        kept = [] if legacy else [a for a in call.args if a.keyword is None][:1]
        kept += [a for a in call.args if a.keyword is not None and a.keyword.value == "device_type"]
        arguments = ", ".join(code(a.with_changes(comma=cst.MaybeSentinel.DEFAULT)) for a in kept)
        off = f"{arguments}, enabled=False" if arguments else "enabled=False"
        block = cst.ensure_type(cst.parse_statement(f"with {code(call.func)}({off}):\n    pass\n"), cst.With)
        return [block.with_changes(body=block.body.with_changes(body=list(statements)))]

    def _fresh(self, base: str) -> str:
        return self.rules.plan.fresh(base)

    # ------------------------------------------------------------- emit: step
    def _plan_step_group(self, found: "StepGroup", optimizer: str, model: str, zero_grads: List[int]) -> None:
        plan = self.rules.plan
        group = list(found.statements)
        step_fn = self._fresh("_step_fn")
        kinds = [self._classify(s) for s in group]
        self._group_edits(group, kinds, optimizer, model)
        moved_zero = None
        if zero_grads:
            zero_call = only_expression(self.body[zero_grads[0]])
            assert isinstance(zero_call, cst.Call)  # a zero_grad() call (_zero_grad_call)
            arguments = ", ".join(code(a).rstrip(", ") for a in zero_call.args)
            moved_zero = cst.parse_statement(f"{optimizer}.zero_grad({arguments})\n")
        escaping = escaping_values(self, [s for s, _ in self._with_kinds(group)])
        in_order = step_decisions.main_thread_work(self, group)
        step_suffix = ", is_async=False" if self.rules.exact or escaping.names or in_order else ""
        branch_update = step_decisions.plan_branch_updates(self, group)

        def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
            inside, update = self._step_body(updated, kinds, optimizer)
            update = update or branch_update
            if moved_zero is not None:
                inside.append(moved_zero)
            if escaping.declaration is not None:
                inside = [escaping.declaration.with_changes(leading_lines=inside[0].leading_lines), *inside]
            definition = cst.ensure_type(cst.parse_statement(f"def {step_fn}():\n    pass\n"), cst.FunctionDef)
            definition = definition.with_changes(
                leading_lines=inside[0].leading_lines,
                body=definition.body.with_changes(body=[inside[0].with_changes(leading_lines=()), *inside[1:]]),
            )
            step = cst.parse_statement(f"{model}.step({step_fn}{step_suffix})\n")
            return [*escaping.bindings, definition, step] + ([update] if update is not None else [])

        plan.edits.replace_range(found.block, found.start, found.end, build)
        self.rules.plan.step_statements.update(self.body[index] for index in zero_grads)
        if multi_step.keeps_zero_grad_in_place(self):
            multi_step.zero_models_in_place(self, zero_grads, optimizer, model)
        else:
            for index in zero_grads:
                plan.edits.replace_range(self.block, index, index + 1, drop_keeping_comments)
        self.rules.plan.step_statements.update(statement for statement, _ in self._with_kinds(group))
        plan.rewrites.append((group[0], self.step_rewrite))
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

    def _group_edits(self, group, kinds, optimizer: str, model: str) -> None:
        """Expression edits inside the step statements: clipping on the optimizer copies,
        ``model.zero_grad`` through the optimizer (whose parameters are the copies)."""
        for statement, kind in self._with_kinds(group):
            if kind == "clip":
                self._clip_on_copies(statement, model)
            if kind == "measure":
                on_copies(self, statement, model)
            if kind == "zero_grad":
                call = only_expression(statement)
                assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)  # what _classify found
                if self.rules.reference(call.func.value) == model:
                    self.rules.plan.edits.replace_expression(call.func.value, lambda _: cst.parse_expression(optimizer))

    def _update_statement(self, original: Optional[cst.BaseStatement]) -> cst.BaseStatement:
        """``scaler.update()`` for the main thread: the original one, kept as written, in both
        forms. With --exact no ``is_async=False`` is needed: after ``model.step(...,
        is_async=False)`` the step was waited for, so a plain ``update()`` applies this
        iteration's result (torch's sequence), and the line stays valid on upstream 0.1.1."""
        if original is not None:
            return original
        return cst.parse_statement(f"{self.scaler}.update()\n")

    def _step_body(self, updated, kinds, optimizer: str):
        """(statements for the step function, the update statement) from the step group."""
        if "update" not in kinds:  # the shared scaler's update comes after a later step
            return list(updated), None
        update_index = kinds.index("update")
        inside = [s for i, s in enumerate(updated) if i != update_index]
        return inside, self._update_statement(updated[update_index])

    def _clip_on_copies(self, statement: cst.BaseStatement, model: str) -> None:
        call = only_expression(statement)

        class Find(cst.CSTVisitor):
            def __init__(inner) -> None:  # noqa: N805
                inner.found: List[cst.Call] = []

            def visit_Call(inner, node: cst.Call) -> None:  # noqa: N805
                if method_call(node, model, "parameters"):
                    inner.found.append(node)

        finder = Find()
        assert call is not None  # a clip call (_classify)
        call.visit(finder)
        for parameters in finder.found:
            self.rules.plan.edits.replace_expression(
                parameters.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
            )


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


@dataclass(frozen=True)
class StepGroup:
    """The optimizer statements of a recognised step: ``statements`` are
    ``block.body[start:end]``; ``condition`` is the ``if`` around them (gradient
    accumulation), else None."""

    block: cst.CSTNode
    start: int
    end: int
    statements: Tuple[cst.BaseStatement, ...]
    condition: Optional[cst.If]


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


@dataclass
class ForwardRegion:
    """Where the forward + loss statements are: ``statements[start:end]`` of ``block``."""

    block: cst.CSTNode
    statements: List[cst.BaseStatement]
    start: int
    end: int
    with_statement: Optional[cst.With]
    outer_index: int  # index in the backward's block of the first statement of the region
    outside: List[cst.BaseStatement] = field(default_factory=list)  # loss after the autocast block
    outside_range: Tuple[int, int] = (0, 0)
