"""One training step, recognised and rewritten: the orchestration of the step rules.

:class:`StepBuilder` is the context of one step around ``scaler.scale(loss).backward()``
(the apex and plain-path steps subclass it, overriding its shape hooks) and runs the rules
of :mod:`migrate.rules` on it in order: the step group and ``_step_fn``
(:mod:`~migrate.rules.step_function`), the model wrap (:mod:`~migrate.rules.model_wrap`),
the fused form with ``_loss_fn`` (:mod:`~migrate.rules.loss_function`) or else the
autograd form (:mod:`~migrate.rules.autograd_form`), and the ordering of main-thread
optimizer writes (:mod:`~migrate.rules.optimizer_writes`). Every rule records its edits in
the shared plan of ``rules`` (:class:`~migrate.torch_amp.TorchAmpRules`: bindings, the
plan, options); a :class:`~migrate.plan.Blocked` anywhere leaves the step untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Set, Tuple, Union

import libcst as cst

from . import joint_steps, multi_step, split_functions, split_step
from .aliases import spellings
from .edits import drop_keeping_comments
from .optimizer_writes import is_scheduler
from .plan import Binding, Blocked
from .recognised import RecognisedStep, StepGroup
from .rules import loss_function, model_wrap, step_function
from .rules.autograd_form import plan_autograd_form
from .rules.loss_function import ForwardPlan, ForwardRegion
from .rules.model_zero_grad import zero_models_beside
from .rules.optimizer_writes import order_optimizer_writes
from .rules.step_function import StepBody
from .step_decisions import refuse_step_chosen_by_a_measure
from .step_values import (
    branches,
)
from .syntax import (
    code,
    dotted,
    method_call,
    names_in,
    only_expression,
)

if TYPE_CHECKING:
    from .apex_two_path import SplitBackward
    from .torch_amp import TorchAmpRules

__all__ = ["StepBuilder", "StepGroup", "UNFUSABLE"]

#: Why the forward and the loss cannot move into a loss function: RPM131 (no forward of the
#: recognised shape right before the backward), RPM132 (a starred model call), RPM133 (the
#: backward keeps its graph for a later one), RPM107 (the model called several times, or
#: another backward in the program), RPM113 (work between the forward and the backward that
#: shares their values). A step refused for one of these takes the autograd form instead,
#: which keeps them as written.
UNFUSABLE = frozenset({"RPM107", "RPM113", "RPM131", "RPM132", "RPM133"})


class StepBuilder:
    """Recognises one training step around ``scaler.scale(loss).backward()`` and plans it.

    The builder is the context every rule function of the step is handed: the step's
    statements, its shape hooks (overridden by the apex and plain-path steps) and the
    shared context ``rules`` (project facts, bindings, the plan, options)."""

    built: Binding  # the first place the optimizer is built (model_for)
    model_outer: str  # the model's name there
    group_condition: Optional[cst.If] = None  # the `if` around the step group, once found
    split: Optional["SplitBackward"] = None  # the two-path split choosing the backward (apex_two_path.py)

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
        # where the step's optimizer is built, with the model's name there (model_for)
        self.builds: List[Tuple[Binding, str]] = []

    # ---------------------------------------------------------------------- plan
    def plan(self) -> None:
        """Plan the step's rewrite into ``rules.plan`` (raises :class:`Blocked` instead)."""
        if multi_step.feeds_later_backward(self):
            return
        found = step_function.find_step_group(self)
        self.group_condition = found.condition  # read by the plain path beside it (migrate.same_condition)
        if split_step.planned_already(self, found):
            return
        refuse_step_chosen_by_a_measure(self, found)
        if joint_steps.steps_several(self, found):
            joint_steps.plan_joint_steps(self, found)
            return
        group = list(found.statements)
        optimizer = self.optimizer_of(group)
        model = self.model_for(optimizer)
        recognised = multi_step.own_statements(self, RecognisedStep(found, optimizer, model))
        self.trained = (optimizer, model)
        self.rules.plan.trained_models[self.backward] = model
        if split_step.plan_detached(self, recognised):
            return
        if split_functions.plan_detached_function(self, recognised):
            return
        try:
            self.check_fusable()
            region = loss_function.forward_region(self, recognised)
            forward = loss_function.plan_forward(self, region, model)
        except Blocked as unfused:
            if not self.autograd_form or unfused.code not in UNFUSABLE:
                raise
            self.plan_autograd_form(recognised, unfused)
            return
        zero_grads = step_function.zero_grads_to_move(self, region, recognised)
        loss_function.emit_forward(self, region, forward)
        self.fused_form_planned(region, zero_grads, forward)
        step_function.plan_step_group(self, recognised, zero_grads)
        self.rules.plan.edits.replace_range(self.block, self.index, self.index + 1, drop_keeping_comments)
        forward_statements = region.with_statement or region.statements[region.start : region.end]
        skipped: Set[cst.CSTNode] = {*recognised.group.statements, self.backward, *region.outside}
        skipped |= {forward_statements} if isinstance(forward_statements, cst.With) else set(forward_statements)
        zero_models_beside(self, recognised, skipped)
        if not self.rules.exact:  # a synchronous step has finished when model.step returns
            order_optimizer_writes(self, recognised, skipped)

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

    def step_body(self, updated: List[cst.BaseStatement], kinds: List[Optional[str]], optimizer: str) -> StepBody:
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

    def scaled_loss(self) -> str:
        """Source text of what the fused form's loss function back-propagates (before the
        microbatch divisor)."""
        return f"{self.scaler}.scale({code(self.loss)})"

    def replaced_backward(self) -> cst.BaseStatement:
        """The statement the fused form's ``forward_backward`` replaces."""
        return self.backward

    def check_fusable(self) -> None:
        """Raise why the step cannot take the fused form (an unfusable code), if it cannot
        (:func:`migrate.multi_step.check_fusable`; the apex two-path split never can)."""
        multi_step.check_fusable(self)

    def plan_autograd_form(self, recognised: RecognisedStep, unfused: Blocked) -> None:
        """See :func:`migrate.rules.autograd_form.plan_autograd_form` (for the modules that
        plan a step found in another method or function, or one of several steps)."""
        plan_autograd_form(self, recognised, unfused)

    # ------------------------------------------------------------ the step group
    def classify(self, statement: cst.BaseStatement) -> Optional[str]:
        """The kind of step statement ``statement`` is in this shape, or None
        (:func:`migrate.rules.step_function.classify_statement` for torch.amp)."""
        return step_function.classify_statement(self, statement)

    def with_kinds(self, group: List[cst.BaseStatement]) -> List[Tuple[cst.BaseStatement, Optional[str]]]:
        """The step group's statements with their kinds, a guarded ``if`` followed by the
        statements of its body."""
        found: List[Tuple[cst.BaseStatement, Optional[str]]] = []
        for statement in group:
            kind = self.classify(statement)
            found.append((statement, kind))
            if kind in ("guarded", "decided") and isinstance(statement, cst.If):
                found += [(inner, self.classify(inner)) for part in branches(statement) for inner in part]
        return found

    def is_scheduler(self, name: str, at: cst.CSTNode) -> bool:
        return is_scheduler(self.rules, name, at)

    def ends_function(self, function: cst.FunctionDef) -> bool:
        """The backward is a statement of ``function``'s own body with only ``return`` lines
        after it (its step, if any, is in another function or method)."""
        after = self.body[self.index + 1 :]
        return self.block is function.body and all(
            isinstance(s, cst.SimpleStatementLine) and isinstance(s.body[0], cst.Return) for s in after
        )

    def mentions(self, node: cst.CSTNode, name: str) -> bool:
        if name == self.scaler and len(self.scaler_spellings) > 1:
            return any(self._mentions_spelling(node, spelling) for spelling in self.scaler_spellings)
        return self._mentions_spelling(node, name)

    def _mentions_spelling(self, node: cst.CSTNode, name: str) -> bool:
        if "." in name or "[" in name:  # an instance attribute (`self.scaler`), a state's field
            return any(dotted(a) == name for a in self.facts.subtree(node, (cst.Attribute, cst.Subscript)))
        return name in names_in(node)

    def optimizer_of(self, group: List[cst.BaseStatement]) -> str:
        """The optimizer the step ``group`` steps
        (:func:`migrate.rules.step_function.optimizer_of` for torch.amp)."""
        return step_function.optimizer_of(self, group)

    def model_for(self, optimizer: str) -> str:
        """The model the step trains with ``optimizer``, its wrap planned
        (:func:`migrate.rules.model_wrap.model_for`; apex follows ``amp.initialize``)."""
        return model_wrap.model_for(self, optimizer)

    def local_name_for(self, model_outer: str, built: Binding) -> str:
        """See :func:`migrate.rules.model_wrap.local_name_for` (for the optimizer helpers)."""
        return model_wrap.local_name_for(self, model_outer, built)

    def plan_wrap(self, built: Binding, model: str) -> None:
        """Wrap ``model`` where the optimizer ``built`` on it is built, its parameters
        grouped by a helper (:mod:`migrate.optimizer_helpers`)."""
        model_wrap.plan_helper_wrap(self, built, model)

    def zero_grad_call(self, statement: cst.BaseStatement, optimizer: str, model: str) -> bool:
        call = only_expression(statement)
        return call is not None and (method_call(call, optimizer, "zero_grad") or method_call(call, model, "zero_grad"))

    @staticmethod
    def model_calls(statement: cst.CSTNode, model: str) -> List[cst.Call]:
        calls: List[cst.Call] = []

        class Find(cst.CSTVisitor):
            def visit_Call(self, call: cst.Call) -> None:
                if dotted(call.func) == model:
                    calls.append(call)

        statement.visit(Find())
        return calls
