"""Rewrite rules for NVIDIA apex amp scripts (``amp.initialize`` + ``amp.scale_loss``).

The migrated script calls :mod:`roundpipe.compat`, which maps apex's settings (opt levels,
loss_scale strings, min/max scale...) at run time, so values known only then (argparse)
keep working:

* ``model, opt = amp.initialize(model, opt, ...)`` -> ``roundpipe.compat.initialize(...)``
  (same arguments, same return shapes; the models come back as RoundPipe models and the
  optimizers hold RoundPipe's optimizer copies);
* ``with amp.scale_loss(loss, opt) as s: s.backward()`` + ``opt.step()`` -> the RoundPipe
  form with the loss's scaler ``roundpipe.compat.loss_scaler(loss_id)`` (bound once as
  ``amp_scaler`` for loss 0);
* ``amp.master_params``, ``amp.state_dict``, ``amp.load_state_dict`` and the function-casting
  API (``amp.float_function``/``half_function``/``bfloat16_function``/``promote_function``,
  ``amp.register_*_function``: apex's semantics, :mod:`roundpipe.compat.functions`) -> their
  ``roundpipe.compat`` twins; apex imports are removed once nothing uses them;
* apex's fused optimizers, SyncBN conversion and DDP: :mod:`migrate.apex_extras`.

With the plain target (``--apex-target plain``) a file whose settings are literals that
upstream RoundPipe's API can follow exactly gets plain code instead of the compat calls
(:mod:`migrate.apex_plain`); any other file keeps the compat form with a note (RPM303).

Everything else apex offers (``delay_unscale``, ``_amp_state``, ``disable_casts``, LAMB...)
is reported (RPM201) and the file is left untouched.
"""

from __future__ import annotations

from typing import Any, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m

from .apex_attributes import HeldOnSelf, held_alias
from .apex_extras import EXTRAS, plan_extra, refusal
from .apex_plain import (
    PlainSetup,
    Unplain,
    helper_statements,
    master_params_text,
    plain_setup,
    steps_follow,
)
from .apex_two_path import (
    anchor_at_split,
    is_overflow_test,
    plan_disabled_initialize,
    refuse_fused,
    split_backward,
)
from .edits import carry_comments
from .header import top_block
from .names import ModuleFacts
from .plan import Blocked, Plan
from .recognised import RecognisedStep
from .rules import step_function
from .rules.apex_autograd_form import plan_apex_autograd_form
from .rules.loss_function import ForwardPlan, ForwardRegion
from .rules.step_function import StepBody
from .steps import StepBuilder
from .syntax import code, dotted, method_call, only_expression
from .torch_amp import TorchAmpRules

__all__ = ["plan_apex"]

_APEX = "apex"
_COMPAT = {
    "apex.amp.initialize": "roundpipe.compat.initialize",
    "apex.amp.master_params": "roundpipe.compat.master_params",
    "apex.amp.state_dict": "roundpipe.compat.state_dict",
    "apex.amp.load_state_dict": "roundpipe.compat.load_state_dict",
    **{
        f"apex.amp.{name}": f"roundpipe.compat.{name}"
        for cast in ("float", "half", "bfloat16", "promote")
        for name in (f"{cast}_function", f"register_{cast}_function")
    },
}
_SCALER = "amp_scaler"
_OLD_INIT = "apex.amp.init"
_FP16_OPTIMIZER = ("apex.fp16_utils.FP16_Optimizer", "apex.fp16_utils.fp16_optimizer.FP16_Optimizer")


class ApexStepBuilder(StepBuilder):
    """A training step around ``with amp.scale_loss(loss, optimizer) as s: s.backward()``."""

    rules: "ApexRules"

    def __init__(
        self,
        rules: "ApexRules",
        statement: cst.BaseStatement,
        loss: cst.BaseExpression,
        optimizer: str,
        scaler: str = _SCALER,
    ) -> None:
        super().__init__(rules, scaler, statement, loss)  # type: ignore[arg-type]
        # A scale_loss block becomes the model's block where the forward cannot be fused
        # (rules/apex_autograd_form.py); FP16_Optimizer's backward and the plain target
        # have only the fused form.
        self.autograd_form = isinstance(statement, cst.With) and rules.plain is None
        self.optimizer = optimizer
        self.anchor = optimizer
        self.first: cst.BaseStatement = statement
        self.split = split_backward(self) if self.autograd_form else None  # apex_two_path.py
        if self.split is not None:
            anchor_at_split(self, self.split)

    def check_fusable(self) -> None:
        if self.split is not None:
            refuse_fused(self, self.split)
        super().check_fusable()

    def classify(self, statement: cst.BaseStatement) -> Optional[str]:
        value = only_expression(statement)
        if isinstance(value, cst.Call) and method_call(value, self.optimizer, "step") and not value.args:
            return "step"
        if isinstance(value, cst.Call) and method_call(value, self.optimizer, "zero_grad"):
            return "zero_grad"
        if self.split is not None and is_overflow_test(statement):  # `is_overflow = math.isnan(grad_norm)`
            return "measure"
        kind = super().classify(statement)
        kept = ("clip", "measure", "zero_grad", "scheduler") + (("guarded",) if self.split is not None else ())
        return kind if kind in kept else None

    # The model and the optimizer may be ``self.<attribute>`` (HeldOnSelf): the name checks
    # of the torch step compare their source text here.
    def model_calls(self, statement: cst.CSTNode, model: str) -> List[cst.Call]:  # type: ignore[override]
        return [call for call in self.facts.find_under(statement, cst.Call) if code(call.func) == model]

    def zero_grad_call(self, statement: cst.BaseStatement, optimizer: str, model: str) -> bool:
        value = only_expression(statement)
        return isinstance(value, cst.Call) and (
            method_call(value, optimizer, "zero_grad") or method_call(value, model, "zero_grad")
        )

    def plan_autograd_form(self, recognised: RecognisedStep, unfused: Blocked) -> None:
        if self.split is not None:
            plan_disabled_initialize(self, self.split, recognised.model)
        plan_apex_autograd_form(self, recognised, unfused)

    def fused_form_planned(self, region: ForwardRegion, zero_grads: List[int], forward: ForwardPlan) -> None:
        self.first = self.body[min([region.outer_index, *zero_grads])]  # where the step's code starts
        self.rules.step_model_calls.add(forward.model_call)

    def optimizer_of(self, group: List[cst.BaseStatement]) -> str:
        kinds = [self.classify(s) for s in group]
        if kinds.count("step") > 1:
            raise Blocked(group[0], "RPM107", "the step must call optimizer.step() once")
        if not kinds.count("step"):
            raise Blocked(group[0], "RPM106", f"no `{self.optimizer}.step()` among {self._stop_after(group)}")
        return self.optimizer

    def _stop_after(self, group: List[cst.BaseStatement]) -> str:
        """The optimizer statements ``group`` and the statement they stop at (the step
        function moves contiguous optimizer statements only)."""
        block = self.facts.parent(group[-1])
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        position = next((i + 1 for i, s in enumerate(body) if s is group[-1]), len(body))
        if position >= len(body):
            return "the optimizer statements after the backward"
        stop = body[position]
        return (
            f"the optimizer statements after the backward: they stop at line {self.facts.line(stop)} "
            f"(`{code(stop).strip().splitlines()[0]}`, not part of a step); move it after the step, "
            "or migrate by hand"
        )

    def model_for(self, optimizer: str) -> str:
        scope = self.facts.scope(self.backward)
        candidates = self.rules.models_in(scope) | self.rules.held_models(self.backward)
        called = {
            name for name in candidates for statement in self.body[: self.index] if self.model_calls(statement, name)
        }
        if not called:
            alias = held_alias(self.body[: self.index], self.rules.held_models(self.backward))
            if alias is not None:
                raise alias
        if len(called) != 1:
            raise Blocked(
                self.backward,
                "RPM108",
                "the model passed through amp.initialize is not called exactly once before this backward",
            )
        return called.pop()

    def holds_model(self, node: cst.BaseExpression, model: str) -> bool:
        return "." in model and (dotted(node) == model or code(node) == model)

    def shape_edits(self, statement: cst.BaseStatement, kind: Optional[str], optimizer: str) -> None:
        if kind == "step":  # `optimizer.step()` steps through the loss's scaler
            call = only_expression(statement)
            assert call is not None  # an optimizer.step() call (classify)
            self.rules.plan.edits.replace_expression(
                call, lambda _: cst.parse_expression(f"{self.scaler}.step({optimizer})")
            )

    def step_body(self, updated: List[cst.BaseStatement], kinds: List[Optional[str]], optimizer: str) -> StepBody:
        inside: List[Any] = list(updated)
        measured = [i for i, kind in enumerate(kinds) if kind in ("clip", "measure", "guarded")]
        if measured:  # apex unscaled on leaving scale_loss; clipping and norms need it too
            first = measured[0]
            unscale = cst.parse_statement(f"{self.scaler}.unscale_({optimizer})\n")
            inside.insert(first, unscale.with_changes(leading_lines=inside[first].leading_lines))
            inside[first + 1] = inside[first + 1].with_changes(leading_lines=())
        return inside, step_function.update_statement(self)


class ApexRules(TorchAmpRules):
    """Finds every use of ``apex`` in a module and plans its RoundPipe replacement."""

    def __init__(self, facts: ModuleFacts, exact: bool, plan: Plan, target: str = "compat") -> None:
        super().__init__(facts, exact)
        self.plan = plan
        self.target = target
        self.plain: Optional[PlainSetup] = None
        self._models: Set[Tuple[int, str]] = set()
        self.notes: List[Tuple[cst.CSTNode, str, str]] = []
        self._scaler_scopes: Set[int] = set()
        self._old_scale_loss: List[cst.Attribute] = []
        self._held: List[HeldOnSelf] = []
        self.step_model_calls: Set[cst.CSTNode] = set()

    def run(self) -> Plan:
        """Plan every apex use; every independent blocker is kept in ``plan.blocked``. When
        setting apex up (``initialize`` and the old APIs) is blocked, the steps are only
        checked for their own blockers (planning them would blame the missing setup), and
        the uses of models held on ``self`` are checked only when every step was planned."""
        uses = self._apex_uses()
        if not uses:
            return self.plan
        if self.target == "plain":
            self._choose_plain(uses)
        known = len(self.plan.blocked)
        for node, qualified in uses:
            if qualified == "apex.amp.initialize":
                self._collect(self._plan_initialize, node)
            elif qualified == _OLD_INIT:
                self._collect(self._plan_old_init, node)
            elif qualified in _FP16_OPTIMIZER:
                self._collect(self._plan_fp16_optimizer, node)
        set_up = len(self.plan.blocked) == known
        for node, qualified in uses:
            if qualified in ("apex.amp.initialize", _OLD_INIT) + _FP16_OPTIMIZER:
                continue
            if qualified == "apex.amp.scale_loss":
                self._collect(self._plan_scale_loss if set_up else self._check_scale_loss, node)
            elif qualified == "apex.amp.master_params" and self.plain is not None:
                self._plain_master_params(node)
            elif qualified in _COMPAT:
                self._rename(node, _COMPAT[qualified])
            elif self._is_import(node):
                continue
            elif qualified in EXTRAS:
                self._collect(plan_extra, self.facts, self.plan, node, qualified)
            else:
                self.plan.blocked.append(
                    refusal(node, qualified)
                    or Blocked(
                        node,
                        "RPM201",
                        f"`{code(node)}` ({qualified}) has no RoundPipe "
                        "equivalent; this file is left for migration by hand",
                    )
                )
        for attribute in self._old_scale_loss:
            self._collect(self._plan_scale_loss, attribute)
        if len(self.plan.blocked) == known:
            in_steps = self.plan.step_statements | self.plan.backward_statements | self.step_model_calls
            for held in self._held:
                self._collect(held.plan_other_uses, self.plan, in_steps)
        self._collect(self._remove_imports)
        return self.plan

    # ------------------------------------------------------------------ discovery
    def _apex_uses(self) -> List[Tuple[cst.CSTNode, str]]:
        uses: List[Tuple[cst.CSTNode, str]] = []
        for node in self.facts.subtree(self.facts.module, (cst.Attribute, cst.Name)):
            if uses and self.facts.within(node, uses[-1][0]):
                continue  # the parts of a recorded ``amp.x`` are not uses of their own
            names = [q for q in self.facts.qualified(node) if q == _APEX or q.startswith(_APEX + ".")]
            if names:
                uses.append((node, max(names, key=len)))
        return uses

    # ------------------------------------------------------------ the plain target
    def _choose_plain(self, uses: List[Tuple[cst.CSTNode, str]]) -> None:
        """Set :attr:`plain` when the whole file can be written with upstream's API, else
        note (RPM303) why it keeps the compat form."""
        allowed = ("apex.amp.scale_loss", "apex.amp.master_params", *EXTRAS)
        found = plain_setup(self.facts, uses, allowed, self.constructed)
        if isinstance(found, PlainSetup):
            withs = [self.facts.statement_of(node) for node, qualified in uses if qualified == "apex.amp.scale_loss"]
            blocks = [w for w in withs if isinstance(w, cst.With)]
            found = steps_follow(self.facts, blocks, found.optimizer) or found
        if isinstance(found, Unplain):
            reason = f"kept on roundpipe.compat, which upstream RoundPipe does not have: {found.reason}"
            self.notes.append((found.node, "RPM303", reason))
            return
        self.plain = found

    def _plan_plain_initialize(self, setup: PlainSetup) -> None:
        """Drop the initialize line; where the optimizer is built, cast the model as apex
        did and wrap it (O1: wrap it in the autocasting RoundPipe, and switch O1's casts on
        where the initialize line was); build the optimizer on the copies; define the helpers."""
        autocast = setup.dtype is None
        names, helpers = helper_statements(self.plan, autocast)
        wrapper = names["model"]
        module = self.facts.module
        spaced = [cst.EmptyLine(), cst.EmptyLine()]
        helpers[0] = helpers[0].with_changes(leading_lines=spaced)
        self.plan.edits.insert_before(module, top_block(module.body)[1], helpers)
        block = self.facts.parent(setup.built)
        assert block is not None  # a statement line lies in a block
        index = list(getattr(block, "body", ())).index(setup.built)
        optim_dtype = "optim_dtype=torch.float32, " if setup.master_weights else ""
        config = f"model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch={self.plan.microbatch})"
        if autocast:
            lines = [f"{setup.model} = {wrapper}({setup.model}, {optim_dtype}{config})\n"]
        else:
            lines = [
                f"{wrapper}({setup.model}, {setup.dtype}, keep_batchnorm_fp32={setup.keep_batchnorm_fp32})\n",
                f"{setup.model} = roundpipe.RoundPipe({setup.model}, {optim_dtype}{config})\n",
            ]
        self.plan.edits.insert_before(block, index, [cst.parse_statement(line) for line in lines])
        for call in m.findall(
            setup.built_value, m.Call(func=m.Attribute(value=m.Name(setup.model), attr=m.Name("parameters")))
        ):
            self.plan.edits.replace_expression(
                call.func,  # type: ignore[attr-defined]
                lambda updated: updated.with_changes(attr=cst.Name("optim_parameters")),
            )
        if autocast:
            self._replace_keeping_comments(setup.statement, f"{names['casts']}()\n")
        else:
            self.drop_statement(setup.statement)
        scope = self.facts.scope(setup.statement)
        self._models.add((id(scope), setup.model))
        self.plan.wrapped_models.append((setup.scope, setup.model, self.facts.order(setup.built)))
        self._models_into_functions(scope, setup.model)
        self.plan.rewrites.append(
            (
                setup.statement,
                "amp.initialize -> an autocasting roundpipe.RoundPipe (O1, plain target)"
                if autocast
                else "amp.initialize -> the model cast as apex did + roundpipe.RoundPipe (plain target)",
            )
        )

    def _replace_keeping_comments(self, statement: cst.BaseStatement, line: str) -> None:
        """Replace ``statement`` in its block by ``line``, which takes its comments."""
        block = self.facts.parent(statement)
        assert isinstance(block, (cst.IndentedBlock, cst.Module))  # a statement's block
        index = list(block.body).index(statement)
        replacement = cst.parse_statement(line)
        self.plan.edits.replace_range(block, index, index + 1, lambda old: [carry_comments(old, replacement)])

    def _plain_master_params(self, node: cst.CSTNode) -> None:
        """``amp.master_params(opt)`` (one argument: checked by :func:`plain_setup`)."""
        call = self.facts.parent(node)
        assert isinstance(call, cst.Call)  # plain_setup checked the call
        self.plan.edits.replace_expression(
            call, lambda updated: cst.parse_expression(master_params_text(code(updated.args[0].value)))
        )

    def _is_import(self, node: cst.CSTNode) -> bool:
        return self.facts.enclosing(node, (cst.Import, cst.ImportFrom)) is not None

    def models_in(self, scope) -> Set[str]:
        return {name for scope_id, name in self._models if scope_id == id(scope)}

    def held_models(self, at: cst.CSTNode) -> Set[str]:
        """``self.<model>`` for the holder classes whose method ``at`` is in."""
        found = {held.expression(held.model, at) for held in self._held}
        return {expression for expression in found if expression is not None}

    def held_optimizer(self, node: cst.BaseExpression) -> Optional[str]:
        """``node``'s text when it is ``self.<optimizer>`` of a holder class's method."""
        for held in self._held:
            if held.optimizer is not None and held.held(node, held.optimizer):
                return code(node)
        return None

    def _rename(self, node: cst.CSTNode, target: str) -> None:
        self.plan.edits.replace_expression(node, lambda _: cst.parse_expression(target))

    # ------------------------------------------------------------------ initialize
    def _plan_initialize(self, node: cst.CSTNode) -> None:
        call = self.facts.parent(node)
        statement = self.facts.statement_of(node)
        if self.plain is not None and statement is self.plain.statement:
            self._plan_plain_initialize(self.plain)
            return
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        if not (
            isinstance(call, cst.Call)
            and call.func is node
            and isinstance(small, cst.Assign)
            and small.value is call
            and len(small.targets) == 1
        ):
            raise Blocked(
                node,
                "RPM201",
                "amp.initialize(...) is not assigned back to the model/optimizer variables; migrate by hand",
            )
        self._rename(node, _COMPAT["apex.amp.initialize"])
        target = small.targets[0].target
        first = target.elements[0].value if isinstance(target, (cst.Tuple, cst.List)) else target
        names = _names(first)
        if not names:
            self._held.append(HeldOnSelf.from_initialize(self.attributes, statement, target, call))
            self.plan.rewrites.append((statement, "amp.initialize -> roundpipe.compat.initialize (held on self)"))
            return
        scope = self.facts.scope(small)
        for name in names:
            self._models.add((id(scope), name))
            self.plan.wrapped_models.append((scope, name, self.facts.order(statement)))
            self._models_into_functions(scope, name)
        self.plan.rewrites.append((statement, "amp.initialize -> roundpipe.compat.initialize"))

    def _models_into_functions(self, scope, name: str) -> None:
        for access in self.facts.accesses(name, scope):
            arg = self.facts.parent(access)
            if isinstance(arg, cst.Arg):
                call = self.facts.parent(arg)
                function = self.facts.local_function(call)
                if function is not None:
                    assert isinstance(call, cst.Call)  # local_function found the function it calls
                    param = self._parameter_for(call, function, arg)
                    inner = self.facts.scope(function.body.body[0])
                    self._models.add((id(inner), param))

    # ------------------------------------------------------------ the old APIs
    def _assignment_of(self, node: cst.CSTNode, what: str) -> Tuple[cst.SimpleStatementLine, cst.Call, str]:
        call = self.facts.parent(node)
        statement = self.facts.statement_of(node)
        small = (
            statement.body[0] if isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1 else None
        )
        if not (
            isinstance(call, cst.Call)
            and call.func is node
            and isinstance(small, cst.Assign)
            and small.value is call
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            raise Blocked(node, "RPM201", f"{what} is not assigned to a plain variable; migrate by hand")
        assert isinstance(statement, cst.SimpleStatementLine)  # small is its only statement
        return statement, call, small.targets[0].target.value

    def _initialize_after_optimizer(
        self, optimizer: str, at: cst.CSTNode, arguments: str, model_suffix: str = ""
    ) -> None:
        """Old APIs had no initialize(model, optimizer): add one after the optimizer is built.

        ``model_suffix`` is appended to the model passed in (``.float()`` for a model the old
        API made half: initialize wants fp32 models and makes the half copy itself)."""
        built = self.constructed(optimizer, at)
        owners = (
            {
                c.func.value.value  # type: ignore[attr-defined]  # the matched Call(func=Attribute(value=Name))
                for c in m.findall(
                    built.value, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("parameters")), args=[])
                )
            }
            if built.value
            else set()
        )
        if len(owners) != 1:
            raise Blocked(at, "RPM108", "the optimizer is not built on `model.parameters()` of one model")
        model = owners.pop()
        block = self.facts.parent(built.statement)
        assert isinstance(block, (cst.IndentedBlock, cst.Module)) and built.statement is not None  # a built optimizer
        index = list(block.body).index(built.statement)
        line = cst.parse_statement(
            f"{model}, {optimizer} = roundpipe.compat.initialize({model}{model_suffix}, {optimizer}{arguments})\n"
        )
        self.plan.edits.insert_before(block, index + 1, [line])
        self._models.add((id(built.scope), model))
        self.plan.wrapped_models.append((built.scope, model, self.facts.order(built.statement)))
        self._models_into_functions(built.scope, model)

    def _plan_old_init(self, node: cst.CSTNode) -> None:
        """``handle = amp.init(...)`` (O1 for the whole script) + ``handle.scale_loss``."""
        statement, call, handle = self._assignment_of(node, "amp.init()")
        enabled = [a for a in call.args if a.keyword is not None and a.keyword.value == "enabled"]
        if len(call.args) != len(enabled):
            raise Blocked(call, "RPM201", "amp.init() arguments other than enabled= are not migrated")
        arguments = ', opt_level="O1"' + "".join(f", enabled={code(a.value)}" for a in enabled)
        scope = self.facts.scope(statement)
        assert scope is not None  # the scope of a statement of the tree
        withs = []
        for access in self.facts.accesses(handle, scope):
            attribute = self.facts.parent(access)
            if not (isinstance(attribute, cst.Attribute) and attribute.attr.value == "scale_loss"):
                raise Blocked(
                    access, "RPM201", f"{handle} (the old amp handle) is used for more than scale_loss; migrate by hand"
                )
            withs.append(attribute)
        optimizers = {self._scale_loss_optimizer(a) for a in withs}
        if len(optimizers) != 1:
            raise Blocked(statement, "RPM107", "the old amp handle scales losses of several optimizers")
        self._initialize_after_optimizer(optimizers.pop(), withs[0], arguments)
        self.drop_statement(statement)
        self.plan.rewrites.append((statement, "amp.init() -> roundpipe.compat.initialize(opt_level='O1')"))
        self._old_scale_loss = withs

    def _scale_loss_optimizer(self, attribute: cst.Attribute) -> str:
        call = self.facts.parent(attribute)
        positional = [a for a in getattr(call, "args", ()) if a.keyword is None]
        if len(positional) != 2 or not isinstance(positional[1].value, cst.Name):
            raise Blocked(attribute, "RPM107", "scale_loss with several optimizers is not migrated")
        return positional[1].value.value

    def _plan_fp16_optimizer(self, node: cst.CSTNode) -> None:
        """``opt = FP16_Optimizer(opt, static_loss_scale=.. | dynamic_loss_scale=True)`` on a
        model the user made half, with ``opt.backward(loss)``: apex O2 (fp32 masters)."""
        statement, call, wrapped = self._assignment_of(node, "FP16_Optimizer(...)")
        inner = call.args[0].value if call.args and call.args[0].keyword is None else None
        if not isinstance(inner, cst.Name) or inner.value != wrapped:
            raise Blocked(
                call,
                "RPM201",
                "FP16_Optimizer must rewrap the same optimizer variable (`optimizer = FP16_Optimizer(optimizer, ...)`)",
            )
        loss_scale = '"dynamic"'
        for arg in call.args[1:]:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword == "static_loss_scale":
                loss_scale = code(arg.value)
            elif keyword == "dynamic_loss_scale":
                if code(arg.value) not in ("True", "False"):
                    raise Blocked(arg, "RPM201", "dynamic_loss_scale must be a literal True/False")
                if code(arg.value) == "False":
                    loss_scale = "1.0" if loss_scale == '"dynamic"' else loss_scale
            elif keyword != "verbose":
                raise Blocked(arg, "RPM201", f"FP16_Optimizer({keyword}=...) is not migrated")
        scope = self.facts.scope(statement)
        assert scope is not None  # the scope of a statement of the tree
        backwards = []
        for access in self.facts.accesses(wrapped, scope):
            attribute = self.facts.parent(access)
            if isinstance(attribute, cst.Attribute) and attribute.attr.value == "backward":
                backwards.append(self.facts.parent(attribute))
        if not backwards:
            raise Blocked(statement, "RPM130", "FP16_Optimizer without optimizer.backward(loss)")
        self._initialize_after_optimizer(
            wrapped, statement, f', opt_level="O2", loss_scale={loss_scale}', model_suffix=".float()"
        )
        self.drop_statement(statement)
        self.plan.rewrites.append((statement, "FP16_Optimizer -> roundpipe.compat.initialize(opt_level='O2')"))
        for backward in backwards:
            assert backward is not None  # the parent of a node of the tree
            line = self.facts.statement_of(backward)
            if only_expression(line) is not backward or not isinstance(backward, cst.Call) or len(backward.args) != 1:
                raise Blocked(backward, "RPM130", "optimizer.backward(loss) must stand on its own line")
            builder = ApexStepBuilder(self, line, backward.args[0].value, wrapped)
            builder.plan()
            self._plan_scaler_binding(line, builder.first)

    # ------------------------------------------------------------------ scale_loss
    def _plan_scale_loss(self, node: cst.CSTNode) -> None:
        statement, loss, optimizer, scaler = self._scale_loss_block(node)
        step = ApexStepBuilder(self, statement, loss, optimizer, scaler)
        step.plan()
        if scaler == _SCALER:  # loss k > 0 calls roundpipe.compat.loss_scaler(k) where used
            self._plan_scaler_binding(statement, step.first)

    def _scale_loss_block(self, node: cst.CSTNode) -> Tuple[cst.With, cst.BaseExpression, str, str]:
        """``with amp.scale_loss(loss, optimizer[, loss_id=k]) as s: s.backward()``: (the
        with statement, the loss, the optimizer's text, the scaler's text)."""
        statement, call, scaler = self._check_scale_loss(node)
        positional = [a for a in call.args if a.keyword is None]
        value = positional[1].value if len(positional) == 2 else None
        if value is None or isinstance(value, (cst.List, cst.Tuple)):
            raise Blocked(call, "RPM107", "amp.scale_loss with several optimizers is not migrated")
        optimizer = value.value if isinstance(value, cst.Name) else self.held_optimizer(value)
        if optimizer is None:
            raise Blocked(
                call,
                "RPM107",
                f"amp.scale_loss's optimizer `{code(value)}` is neither a variable nor the "
                "`self.<attribute>` that amp.initialize returned to",
            )
        return statement, positional[0].value, optimizer, scaler

    def _check_one_loss(self, statement: cst.With) -> None:
        """A ``scale_loss`` block right after another one backs a second loss of the same
        step (``num_losses``/``loss_id``): RPM130, not a forward looked for in the first."""
        block = self.facts.parent(statement)
        body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        index = next((i for i, s in enumerate(body) if s is statement), 0)
        previous = body[index - 1] if index > 0 else None
        if isinstance(previous, cst.With) and any(
            isinstance(item.item, cst.Call) and self.facts.calls_any(item.item, {"apex.amp.scale_loss"})
            for item in previous.items
        ):
            raise Blocked(
                statement,
                "RPM130",
                "a second amp.scale_loss block right after another (several losses in one step): "
                "one RoundPipe step backs one loss; add the losses, or migrate by hand",
            )

    def _check_scale_loss(self, node: cst.CSTNode) -> Tuple[cst.With, cst.Call, str]:
        """The checks of a ``scale_loss`` block that need no apex set-up (its shape, its
        keywords): (the with statement, the call, the scaler's text)."""
        call = self.facts.parent(node)
        item = self.facts.parent(call)
        statement = self.facts.parent(item)
        if not (
            isinstance(call, cst.Call)
            and isinstance(item, cst.WithItem)
            and isinstance(statement, cst.With)
            and len(statement.items) == 1
            and isinstance(item.asname, cst.AsName)
            and isinstance(item.asname.name, cst.Name)
        ):
            raise Blocked(
                node, "RPM201", "amp.scale_loss is not used as `with amp.scale_loss(loss, optimizer) as scaled: ...`"
            )
        scaled = item.asname.name.value
        body = list(statement.body.body)
        backward = only_expression(body[0]) if len(body) == 1 else None
        if backward is None or not m.matches(
            backward, m.Call(func=m.Attribute(value=m.Name(scaled), attr=m.Name("backward")), args=[])
        ):
            raise Blocked(statement, "RPM130", f"the amp.scale_loss block must hold only `{scaled}.backward()`")
        self._check_one_loss(statement)
        scaler = _SCALER
        for arg in call.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword in ("delay_unscale", "delay_overflow_check", "model"):
                raise Blocked(
                    arg,
                    "RPM201",
                    f"amp.scale_loss({keyword}=...) has no RoundPipe equivalent; left for migration by hand",
                )
            if keyword == "loss_id" and code(arg.value) != "0":  # loss k's own scaler, as apex
                scaler = f"roundpipe.compat.loss_scaler({code(arg.value)})"
        return statement, call, scaler

    def _plan_scaler_binding(self, backward: cst.BaseStatement, first: cst.BaseStatement) -> None:
        """``amp_scaler = roundpipe.compat.loss_scaler()`` once per scope, before the loop, or
        without a loop before ``first``, the step's first statement (the loss function reads it)."""
        scope = self.facts.scope(backward)
        if id(scope) in self._scaler_scopes:
            return
        self._scaler_scopes.add(id(scope))
        anchor: cst.BaseStatement = first
        loop = self.facts.enclosing(backward, (cst.For, cst.While, cst.FunctionDef))
        if isinstance(loop, (cst.For, cst.While)) and self.facts.scope(loop) is scope:
            anchor = loop
        block = self.facts.parent(anchor)
        assert isinstance(block, (cst.IndentedBlock, cst.Module))  # a statement's block
        index = list(block.body).index(anchor)
        scaler = self.plain.scaler if self.plain is not None else "roundpipe.compat.loss_scaler()"
        line = cst.parse_statement(f"{_SCALER} = {scaler}\n")
        self.plan.edits.insert_before(block, index, [line])

    # ------------------------------------------------------------------ imports
    def _remove_imports(self) -> None:
        for statement in self.facts.import_lines:
            if not all(isinstance(s, (cst.Import, cst.ImportFrom)) for s in statement.body):
                continue
            if not any(self._imports_apex(s) for s in statement.body):
                continue
            if not all(self._imports_apex(s) for s in statement.body):
                raise Blocked(
                    statement, "RPM201", "apex imported together with other modules on one line; split the import first"
                )
            self.drop_line(statement)

    @staticmethod
    def _imports_apex(small: cst.BaseSmallStatement) -> bool:
        if isinstance(small, cst.ImportFrom):
            module = code(small.module) if small.module is not None else ""
            return module == _APEX or module.startswith(_APEX + ".")
        if isinstance(small, cst.Import):
            return all(code(alias.name).split(".")[0] == _APEX for alias in small.names)
        return False


def _names(node: cst.BaseExpression) -> List[str]:
    if isinstance(node, cst.Name):
        return [node.value]
    if isinstance(node, (cst.Tuple, cst.List)):
        return [n for element in node.elements for n in _names(element.value)]
    return []


def plan_apex(
    facts: ModuleFacts, exact: bool, plan: Plan, target: str = "compat"
) -> List[Tuple[cst.CSTNode, str, str]]:
    """Add the apex rewrites to ``plan``; return informational notes (node, code, text).

    ``target``: ``"compat"`` (calls of :mod:`roundpipe.compat`) or ``"plain"`` (upstream
    RoundPipe's API where the file's settings allow it, see :mod:`migrate.apex_plain`)."""
    rules = ApexRules(facts, exact, plan, target)
    rules.run()
    return rules.notes
