"""After the model is wrapped: checkpoints through the wrapped module, and the newest weights
synchronized into the model before evaluation or saving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Scope

from .attributes import InstanceFamily
from .deferred_syncs import DeferredSynchronizations
from .gradient_reads import check_gradient_reads
from .instance_outside import getattr_reads, optimizer_statements
from .method_entry import MethodEntries
from .method_forward import check_method_forward
from .model_averages import check_parameters_handed, hand_to_average, kept_by
from .overridden import never_runs
from .parallel import other_trainer
from .plan import Blocked
from .reached_models import unproven_reach
from .returned import returned_targets
from .rules.model_zero_grad import emit_model_zeroing
from .shared_parameters import ParameterFeeds
from .split_step import calls_own_method
from .state_helpers import state_only_parameter
from .state_objects import StateField
from .synchronize import Synchronizations
from .syntax import code, dotted
from .weight_writes import check_weight_write
from .wrapped_containers import plan_container_use
from .wrapped_names import NAMED_ITERATORS, keeps_wrapper_names

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .torch_amp import TorchAmpRules

__all__ = ["ModelUses"]

_BEFORE_USE = "before evaluation/saving"
_OPTIMIZER_STATE = "before a main-thread use of optimizer state (it would race with the asynchronous step)"
_AFTER_TRAINING = "before a use of the weights after training (the last asynchronous step may still run)"

#: methods of the wrapped model that read no weight (or synchronize on their own)
_NO_WEIGHT_READ = {"train", "eval", "zero_grad", "requires_grad_", "state_dict", "synchronize"}

_NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}


def _backward_under(facts: "ModuleFacts", node: cst.CSTNode) -> bool:
    return any(facts.within(call, node) for call in facts.backward_calls)


#: functions that pickle their first (``obj``) argument whole
_SAVERS = ("torch.save", "torch.serialization.save", "pickle.dump", "pickle.dumps")


class ModelUses:
    """After wrapping: checkpoints go through the wrapped module (``model.model``) and the
    newest weights are synchronized into the model before evaluation or saving."""

    def __init__(self, rules: "TorchAmpRules") -> None:
        self.rules = rules
        self.facts = rules.facts
        syncs = Synchronizations(self.facts, rules.plan)
        self._syncs = DeferredSynchronizations(syncs)
        self._entries = MethodEntries(self.facts, syncs)
        self._feeds = ParameterFeeds(self.facts, rules._parameter_for)
        # (alias, source rank of its binding) -> the rank from which what it names is the wrapped
        # model: training between the two still leaves a step running for the alias's reads
        self._trained_since: Dict[Tuple[str, int], int] = {}
        self._called_with_grad: Dict[
            cst.CSTNode, Dict[str, List[cst.Call]]
        ] = {}  # function -> attribute model -> calls

    def plan(self) -> None:
        emit_model_zeroing(self.facts, self.rules.plan)
        for statement, name in self.rules.plan.synchronize_before:
            if statement in self.rules.plan.step_statements:
                continue  # moved into a step function (another path's step) after all
            self._syncs.before(
                statement,
                name,
                "before a main-thread write of optimizer state (it would race with the asynchronous step)",
            )
        seen: Set[Tuple[int, str]] = set()
        # A name wrapped twice in one scope (a model rebuilt and wrapped again) is followed
        # from its first wrap: popped first, it covers the uses between the two wraps too.
        queue: List[Tuple[object, str, int]] = sorted(
            self.rules.plan.wrapped_models, key=lambda wrapped: wrapped[2], reverse=True
        )
        while queue:
            scope, name, after = queue.pop()
            if (id(scope), name) in seen:
                continue
            seen.add((id(scope), name))
            for access in self.rules.accesses(name, scope):
                if not self.rules.runs_after(access, scope, after) or self._in_stopped_guard(access):
                    continue
                if isinstance(scope, StateField):  # read as `state.model`: that is its name here
                    name = dotted(access) or code(access)
                given = self.rules.state_objects.field_given(access)
                if given is not None:  # put in a state object: its reads are the model's
                    queue.append((self.rules.state_objects.field(*given), given[1], 0))
                    continue
                # `model[0]` -> `model.model[0]`; not for a parameter rebound as `nets = [nets]`
                container = not self._rebound_parameter(name, scope)
                if container and plan_container_use(self.facts, self.rules.plan, access, name):
                    self._after_training(access, name, after)
                check_weight_write(self.facts, self.rules.plan, access, name)
                parent = self.facts.parent(access)
                if isinstance(parent, cst.Attribute) and parent.value is access:
                    self._plan_attribute(parent, access, name, after)
                elif isinstance(parent, cst.Call) and parent.func is access:
                    self._plan_inference_call(access, name, after)
                elif isinstance(parent, cst.Arg):
                    queue.extend(self._plan_argument(parent, access, name, after))
                elif isinstance(parent, cst.Assign) and parent.value is access:
                    aliases = self._aliases(parent, scope)  # raw_model = model: same object
                    for _, alias, rank in aliases:  # trained since the model's wrap, not the alias's binding
                        self._trained_since[(alias, rank)] = self._trained_since.get((name, after), after)
                    queue.extend(aliases)
                else:  # `return model, optimizer` of a setup function: its callers' names
                    self._check_held_in_literal(access, name)
                    queue.extend(self._returned_to(access))
            if isinstance(scope, InstanceFamily):  # `trainer.model.parameters()` in the script driving it
                queue.extend(self._plan_outside(scope, name))
            if not isinstance(scope, StateField):  # a state's field has no name to alias before the wrap
                self._check_aliases_before(scope, name, after)
        self._check_other_backwards()
        self._check_steps_reach_one_model()
        self._syncs.replay(
            lambda node, model: self._before_shared_function(node, model) or self._before_forward(node, model)
        )
        self._feeds.check(self.rules.plan.edits)
        check_gradient_reads(self.facts, self.rules.plan)

    def _rebound_parameter(self, name: str, scope: object) -> bool:
        """``name`` is a parameter of a function the model is handed to, bound again in that
        function (``if not isinstance(nets, list): nets = [nets]``)."""
        if isinstance(scope, (InstanceFamily, StateField)):
            return False
        bindings = self.rules.assignments(name, scope)
        return len(bindings) > 1 and any(isinstance(binding, cst.Param) for binding in bindings)

    def _plan_argument(
        self, arg: cst.Arg, access: cst.BaseExpression, name: str, after: int
    ) -> List[Tuple[Scope, str, int]]:
        """The wrapped model ``name`` handed to a call as ``arg``: a checkpoint helper or a
        saver gets the wrapped module, an EMA its reads after training, a function or method
        of the file is followed into (the parameter to follow, returned)."""
        if self._hand_to_state_helper(arg, access, name) or self._saved_whole(arg, access, name):
            return []
        if hand_to_average(self.facts, self.rules.plan, arg, access, name):
            self._reads_through_average(arg, name, after)
        else:
            self._check_handed_over(arg, access)
        self._after_training(access, name, after)
        target = self._parameter_target(arg) or self._method_target(arg)
        if target is None:
            return []
        self._feeds.record(arg, *target[3:], target[1])
        return [target[:3]]

    def _plan_outside(self, family: InstanceFamily, name: str) -> List[Tuple[Scope, str, int]]:
        """The uses of ``family``'s wrapped model ``name`` (``self.model``) and of its
        optimizer through an instance built outside the class (:mod:`migrate.instance_outside`):
        the model's as the class's own reads of it, through the instance (``trainer.model``);
        a statement touching the optimizer's state after the running step
        (``trainer.model.synchronize()`` before it; nothing with ``--exact``). Each use
        handled is claimed; the others stay refused (RPM120), as does ``getattr(trainer, ...)``.
        Returns the parameters of the functions of the file the model is handed to, to follow."""
        refused = getattr_reads(family)
        if refused:
            raise refused[0]
        attribute = name.partition(".")[2]
        handed: List[Tuple[Scope, str, int]] = []
        for use in family.deferred_uses(attribute):
            parent = self.facts.parent(use)
            model = code(use)
            if isinstance(parent, cst.Attribute) and parent.value is use:
                check_weight_write(self.facts, self.rules.plan, use, model)
                self._plan_attribute(parent, use, model, 0)
            elif isinstance(parent, cst.Call) and parent.func is use:
                self._plan_inference_call(use, model, 0)
            elif isinstance(parent, cst.Arg) and parent.value is use and not parent.star:
                handed += self._plan_argument(parent, use, model, 0)  # `evaluate(trainer.model, loader)`
            else:
                continue  # aliased, stored: not followed
            family.claim(use)
        wrapped = {n.partition(".")[2] for s, n, _ in self.rules.plan.wrapped_models if s is family}
        for optimizer, reads in family.step_optimizers.items():
            if reads & wrapped != {attribute}:
                continue  # the optimizer of another model, or of several
            for statement, uses in optimizer_statements(family, family.deferred_uses(optimizer)).items():
                for use in uses:
                    family.claim(use)
                for instance in [] if self.rules.exact else sorted({code(use.value) for use in uses}):
                    self._syncs.before(statement, f"{instance}.{attribute}", _OPTIMIZER_STATE)
        return handed

    def _reads_through_average(self, arg: cst.Arg, name: str, after: int) -> None:
        """Every method call of an EMA object that keeps the wrapped module reads its weights
        (:func:`migrate.model_averages.kept_by`): after training, it waits for the last step."""
        bound = kept_by(self.facts, arg)
        scope = self.facts.scope(arg)
        if bound is None or scope is None:
            return
        for use in self.facts.accesses(bound.value, scope):
            if self.facts.order(use) > self.facts.order(bound):
                self._after_training(use, name, after)

    def _before_shared_function(self, node: cst.CSTNode, model: str) -> Optional[List[Tuple[cst.CSTNode, str]]]:
        """A synchronize before ``node`` in a function of the file that gets ``model`` as a
        parameter, does not train it, and is also called with other objects
        (``evaluate(model_ema)``): before each call handing it the RoundPipe model instead
        (:mod:`migrate.deferred_syncs`); None to keep it where it was asked for."""
        function = self.facts.enclosing(node, (cst.FunctionDef,))
        if function is None or model not in {p.name.value for p in function.params.params}:
            return None
        if self._syncs.trains(function.body, model):
            return None
        args = self._feeds.fed_arguments(function, model)
        if args is None:
            return None
        return [(arg, dotted(arg.value) or code(arg.value)) for arg in args]

    def _before_forward(self, node: cst.CSTNode, model: str) -> Optional[List[Tuple[cst.CSTNode, str]]]:
        """A synchronize between a forward of ``model`` (autograd form: ``out = model(x)``)
        and a backward later in the same block would write the weights the backward still
        needs: before the first such forward since the last training statement instead (the
        statements it moves over do not train, so it waits for the same step); None to keep it."""
        statement = self.facts.statement_of(node)
        block = self.facts.parent(statement)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return None
        body = list(block.body)
        index = body.index(statement)
        if not any(_backward_under(self.facts, s) for s in body[index:]):
            return None
        first: Optional[cst.BaseStatement] = None
        for earlier in reversed(body[:index]):
            if self._syncs.trains(earlier, model):
                break
            if any(dotted(call.func) == model for call in self.facts.subtree(earlier, cst.Call)):
                first = earlier
        return [(first, model)] if first is not None else None

    def _in_stopped_guard(self, node: cst.CSTNode) -> bool:
        """Under a DDP branch whose body now raises (:mod:`migrate.ddp_guard`): never runs."""
        return any(self.facts.within(node, guard.body) for guard in self.rules.plan.stopped_guards)

    def _returned_to(self, access: cst.BaseExpression) -> List[Tuple[Scope, str, int]]:
        """The callers' names for a returned wrapped model (none where it cannot be followed:
        the model then leaves the file as before)."""
        try:
            targets = returned_targets(self.facts, access) or []
        except Blocked:
            return []
        return [(scope, name, self.facts.order(call)) for scope, name, call in targets]

    def _hand_to_state_helper(self, arg: cst.Arg, access: cst.BaseExpression, name: str) -> bool:
        """``save_checkpoint(path, model)`` of another file that only saves or loads the
        model's state: the helper gets the wrapped module (``model.model``, the original
        keys) after a synchronize (:mod:`migrate.state_helpers`)."""
        call = self.facts.parent(arg)
        if not isinstance(call, cst.Call) or arg.value is not access:
            return False
        if state_only_parameter(self.rules.state_helpers, call, arg) is None:
            return False
        self.rules.plan.edits.replace_expression(
            access, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model"))
        )
        self.rules.plan.rewrites.append(
            (
                call,
                f"{name} -> {name}.model: {code(call.func)}() is a checkpoint helper of another file; "
                "it gets the wrapped module",
            )
        )
        self._syncs.before(access, name, "before a checkpoint helper of another file")
        return True

    def _saved_whole(self, arg: cst.Arg, access: cst.BaseExpression, name: str) -> bool:
        """``torch.save(model, path)`` (or ``pickle.dump``/``pickle.dumps``, the object
        positional first or as ``obj=``) pickles the whole module: it gets the wrapped module
        (``model.model``, what the original saved) after a synchronize."""
        call = self.facts.parent(arg)
        if not (isinstance(call, cst.Call) and call.args and arg.value is access):
            return False
        saver = next((s for s in _SAVERS if self.facts.calls_any(call, {s})), None)
        if saver is None or not (arg is call.args[0] if arg.keyword is None else arg.keyword.value == "obj"):
            return False
        self.rules.plan.edits.replace_expression(
            access, lambda updated: cst.Attribute(value=updated, attr=cst.Name("model"))
        )
        short = saver.rsplit(".", 1)[-1]
        self.rules.plan.rewrites.append((call, f"{short}({name}) -> {short}({name}.model): the wrapped module"))
        self._syncs.before(access, name, _BEFORE_USE)
        return True

    def _after_training(self, access: cst.BaseExpression, name: str, after: int) -> None:
        """In the asynchronous form, a use of the weights after a statement (past source rank
        ``after``, where ``name`` holds the wrapped model, or, for an alias, since the model
        it names was wrapped) that trains waits for the last step
        (:meth:`migrate.synchronize.Synchronizations.after_training`); the exact form's step
        has finished by then."""
        moved = self.rules.plan.step_statements | self.rules.plan.backward_statements
        if self.rules.exact or any(a in moved for a in self.facts.ancestors(access)):
            return  # synchronous, or part of a step (its own thread orders it)
        arg = self.facts.parent(access)
        call = self.facts.parent(arg) if isinstance(arg, cst.Arg) else None
        function = self.facts.local_function(call) if isinstance(call, cst.Call) else None
        if function is not None and self._syncs.trains(function.body, name):
            return  # handed to a training function: its next step follows the last one
        entered_trained = self._entries.after_training(access, name)
        since = self._trained_since.get((name, after), after)
        self._syncs.after_training(access, name, _AFTER_TRAINING, since, entered_trained)

    def _check_held_in_literal(self, access: cst.BaseExpression, name: str) -> None:
        """``torch.save([model, optimizer], path)``: a list, set or tuple literal holding the
        wrapped model, handed to a function of another module or library, hands it the
        RoundPipe object (RPM125, as for a dict); a function of the file is not looked into."""
        element = self.facts.parent(access)
        literal = self.facts.parent(element)
        if not (isinstance(element, cst.Element) and isinstance(literal, (cst.List, cst.Set, cst.Tuple))):
            return
        arg = self.facts.parent(literal)
        call = self.facts.parent(arg)
        if not (isinstance(arg, cst.Arg) and isinstance(call, cst.Call)) or self.facts.local_function(call):
            return
        if m.matches(call.func, m.Attribute(value=m.Name("self"))):
            return
        raise Blocked(
            literal,
            "RPM125",
            f"`{code(literal)}` holds the wrapped model {name!r} and is handed to `{code(call.func)}(...)`: "
            f"the RoundPipe object, not the module the original held, is what it gets; hold {name}.model, "
            "or migrate by hand",
        )

    def _check_handed_over(self, arg: cst.Arg, access: cst.BaseExpression) -> None:
        call = self.facts.parent(arg)
        found = other_trainer(self.facts, call) if isinstance(call, cst.Call) else None
        if found is not None and isinstance(call, cst.Call):
            code_, reason = found
            raise Blocked(
                call,
                code_,
                f"the wrapped model {code(access)!r} is handed to "
                f"`{code(call.func)}(...)`: {reason}; RoundPipe must be the only one "
                "training it; left untouched",
            )

    def _aliases(self, assign: cst.Assign, scope: object) -> List[Tuple[Scope, str, int]]:
        """The names ``assign`` binds to the model; an instance attribute's alias is a name of
        the method that binds it."""
        here = scope if isinstance(scope, Scope) else self.facts.scope(assign)
        if here is None:
            return []
        return [
            (here, t.target.value, self.facts.order(assign)) for t in assign.targets if isinstance(t.target, cst.Name)
        ]

    def _check_aliases_before(self, scope: object, name: str, after: int) -> None:
        """``model_without_ddp = model`` before the wrap names the unwrapped module: a use of
        it after the wrap trains or saves something RoundPipe does not manage."""
        if after <= 0:
            return
        for access in self.rules.accesses(name, scope):
            parent = self.facts.parent(access)
            if self.rules.runs_after(access, scope, after - 1):
                continue
            self._check_state_before(access, name)
            if not (isinstance(parent, cst.Assign) and parent.value is access):
                continue
            for alias_scope, alias, _ in self._aliases(parent, scope):
                if any(s is alias_scope and n == alias for s, n, _ in self.rules.plan.wrapped_models):
                    continue  # bound again to the RoundPipe model after the wrap (migrate.ddp_guard)
                assert alias_scope is not None  # the scope of a node of the tree
                late = [a for a in self.facts.accesses(alias, alias_scope) if self.facts.order(a) > after]
                if late:
                    raise Blocked(
                        late[0],
                        "RPM114",
                        f"{alias!r} is bound to {name!r} before the "
                        f"RoundPipe wrap and used after it; it still names the unwrapped "
                        f"module (bind it after the wrap, to {name}.model); left untouched",
                    )

    def _check_state_before(self, access: cst.BaseExpression, name: str) -> None:
        """``state = {"model": model}`` before the RoundPipe wrap: the state keeps the
        unwrapped module, so a read of it after the wrap trains or saves something RoundPipe
        does not manage (RPM125)."""
        given = self.rules.state_objects.field_given(access)
        if given is None:
            return
        reads = self.rules.state_objects.field(*given).reads
        if reads:
            raise Blocked(
                reads[0],
                "RPM125",
                f"`{code(self.facts.statement_of(reads[0])).strip()}` reads the model the state object got before "
                f"the RoundPipe wrap of {name!r} (line {self.facts.line(access)}): it is still the unwrapped "
                "module; build the state after the optimizer, or migrate by hand",
            )

    def _check_other_backwards(self) -> None:
        """A backward outside the recognised steps trains the wrapped model another way."""
        steps = self.rules.plan.backward_statements
        if not self.rules.plan.wrapped_models:
            return
        for call in self.facts.backward_calls:
            if any(a in steps for a in self.facts.ancestors(call)) or calls_own_method(self.rules, call):
                continue
            if never_runs(self.rules, call):
                continue  # a base's step that every class built overrides (migrate.overridden)
            raise Blocked(
                call,
                "RPM115",
                f"`{code(call)}` runs a backward outside the migrated "
                "training step (a second training loop?); with the model wrapped it "
                "would not train through RoundPipe's step; left untouched",
            )

    def _plan_attribute(self, attribute: cst.Attribute, access: cst.BaseExpression, name: str, after: int) -> None:
        method = attribute.attr.value
        check_method_forward(self.facts, self.rules.plan, attribute, name)
        if method == "module":
            raise Blocked(
                attribute,
                "RPM114",
                f"`{name}.module` (a DDP-style inner module) is "
                f"not an attribute of a RoundPipe model (its module is {name}.model); "
                "left untouched",
            )
        if method in ("state_dict", "load_state_dict") or (
            method in NAMED_ITERATORS and not keeps_wrapper_names(self.facts, self.rules.plan, attribute)
        ):  # the wrapped module's own names, not the wrapper's (see migrate.wrapped_names)
            self.rules.plan.edits.replace_expression(
                attribute,
                lambda updated: updated.with_changes(value=cst.Attribute(value=updated.value, attr=cst.Name("model"))),
            )
        if method == "parameters":
            check_parameters_handed(self.facts, attribute, name)
        if method in ("eval", "state_dict") or (method == "load_state_dict" and "." in name):
            # an instance's model may be loaded while its step runs (a local one, before)
            self._syncs.before(access, name, _BEFORE_USE)
        elif method not in _NO_WEIGHT_READ:
            self._after_training(access, name, after)

    def _plan_inference_call(self, access: cst.BaseExpression, name: str, after: int) -> None:
        """A model call inside ``with torch.no_grad()``/``inference_mode()`` evaluates: the
        newest weights are synchronized into the model before that block."""
        for ancestor in self.facts.ancestors(access):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.facts.calls_any(item.item, _NO_GRAD) for item in ancestor.items
            ):
                self._syncs.before(ancestor, name, _BEFORE_USE)
                return
        self._after_training(access, name, after)
        function = self.facts.enclosing(access, (cst.FunctionDef,))
        call = self.facts.parent(access)
        if "." in name and function is not None and isinstance(call, cst.Call):  # `self.D(x)`, with gradients
            self._called_with_grad.setdefault(function, {}).setdefault(name, []).append(call)

    def _check_steps_reach_one_model(self) -> None:
        """A method holding a training step that also calls another wrapped instance model
        with gradients (a GAN's generator step through the discriminator): its backward may
        reach that model's parameters, whose gradients RoundPipe's step for the first does
        not hand over; refused unless that is proven harmless (:mod:`migrate.reached_models`)."""
        for backward in sorted(self.rules.plan.backward_statements, key=self.facts.order):
            function = self.facts.enclosing(backward, (cst.FunctionDef,))
            called = self._called_with_grad.get(function, {}) if function is not None else {}
            if len(called) < 2:
                continue
            found = unproven_reach(self.facts, self.rules.plan, backward, called)
            if found is not None:
                raise Blocked(found[0], "RPM107", found[1])

    def _parameter_target(self, arg: cst.Arg) -> Optional[Tuple[Scope, str, int, cst.FunctionDef]]:
        fed = self.rules.parameter_fed_by(arg)
        function = self.facts.local_function(self.facts.parent(arg))
        return (*fed, 0, function) if fed is not None and function is not None else None

    def _method_target(self, arg: cst.Arg) -> Optional[Tuple[Scope, str, int, cst.FunctionDef]]:
        """``self.weights_of(model)``: the parameter of the method of the enclosing class
        that ``arg`` feeds (the model is followed into it as into a function), else None."""
        call = self.facts.parent(arg)
        klass = self.facts.enclosing(arg, (cst.ClassDef,))
        if not (isinstance(call, cst.Call) and m.matches(call.func, m.Attribute(value=m.Name("self"))) and klass):
            return None
        assert isinstance(call.func, cst.Attribute)
        wanted = call.func.attr.value
        methods = [s for s in klass.body.body if isinstance(s, cst.FunctionDef) and s.name.value == wanted]
        if len(methods) != 1 or not methods[0].body.body:
            return None
        try:
            parameter = self.rules._parameter_for(call, methods[0], arg)
        except Blocked:
            return None
        scope = self.facts.scope(methods[0].body.body[0])
        return (scope, parameter, 0, methods[0]) if scope is not None else None
