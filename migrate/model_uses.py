"""After the model is wrapped: checkpoints through the wrapped module, and the newest weights
synchronized into the model before evaluation or saving."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Scope

from .parallel import other_trainer
from .plan import Blocked
from .returned import returned_targets
from .split_step import calls_own_method
from .state_helpers import state_only_parameter
from .syntax import code, method_call, only_expression

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["ModelUses"]

_NO_GRAD = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}


class ModelUses:
    """After wrapping: checkpoints go through the wrapped module (``model.model``) and the
    newest weights are synchronized into the model before evaluation or saving."""

    def __init__(self, rules: "TorchAmpRules") -> None:
        self.rules = rules
        self.facts = rules.facts
        self._synced: Set[Tuple[int, int, str]] = set()  # (block, index, model) already given a sync
        self._called_with_grad: Dict[cst.CSTNode, Dict[str, cst.Call]] = {}  # function -> attribute model -> call

    def plan(self) -> None:
        for statement, name in self.rules.plan.synchronize_before:
            if statement in self.rules.plan.step_statements:
                continue  # moved into a step function (another path's step) after all
            self._synchronize_before(
                statement,
                name,
                "before a main-thread write of optimizer state (it would race with the asynchronous step)",
            )
        seen: Set[Tuple[int, str]] = set()
        queue = list(self.rules.plan.wrapped_models)
        while queue:
            scope, name, after = queue.pop()
            if (id(scope), name) in seen:
                continue
            seen.add((id(scope), name))
            for access in self.rules._accesses(name, scope):
                if not self.rules._runs_after(access, scope, after) or self._in_stopped_guard(access):
                    continue
                if self.facts.statement_of(access) in self.rules.plan.replaced_statements:
                    continue
                parent = self.facts.parent(access)
                if isinstance(parent, cst.Attribute) and parent.value is access:
                    self._plan_attribute(parent, access, name)
                elif isinstance(parent, cst.Call) and parent.func is access:
                    self._plan_inference_call(access, name)
                elif isinstance(parent, cst.Arg):
                    if self._hand_to_state_helper(parent, access, name):
                        continue
                    self._check_handed_over(parent, access)
                    target = self._parameter_target(parent)
                    if target is not None:
                        queue.append(target)
                elif isinstance(parent, cst.Assign) and parent.value is access:
                    queue.extend(self._aliases(parent, scope))  # raw_model = model: same object
                else:  # `return model, optimizer` of a setup function: its callers' names
                    queue.extend(self._returned_to(access))
            self._check_aliases_before(scope, name, after)
        self._check_other_backwards()
        self._check_steps_reach_one_model()

    def _in_stopped_guard(self, node: cst.CSTNode) -> bool:
        """Under a DDP branch whose body now raises (:mod:`migrate.ddp_guard`): never runs."""
        return any(self.facts.within(node, guard.body) for guard in self.rules.plan.stopped_guards)

    def _returned_to(self, access: cst.Name) -> List[Tuple[Scope, str, int]]:
        """The callers' names for a returned wrapped model (none where it cannot be followed:
        the model then leaves the file as before)."""
        try:
            targets = returned_targets(self.facts, access) or []
        except Blocked:
            return []
        return [(scope, name, self.facts.order(call)) for scope, name, call in targets]

    def _hand_to_state_helper(self, arg: cst.Arg, access: cst.Name, name: str) -> bool:
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
        self._synchronize_before(access, name, "before a checkpoint helper of another file")
        return True

    def _check_handed_over(self, arg: cst.Arg, access: cst.Name) -> None:
        call = self.facts.parent(arg)
        found = other_trainer(self.facts, call) if isinstance(call, cst.Call) else None
        if found is not None and isinstance(call, cst.Call):
            code_, reason = found
            raise Blocked(
                call,
                code_,
                f"the wrapped model {access.value!r} is handed to "
                f"`{code(call.func)}(...)`: {reason}; RoundPipe must be the only one "
                "training it; left untouched",
            )

    def _aliases(self, assign: cst.Assign, scope: Scope) -> List[Tuple[Scope, str, int]]:
        """The names ``assign`` binds to the model; an instance attribute's alias is a name of
        the method that binds it."""
        if not isinstance(scope, Scope):
            scope = self.facts.scope(assign)
        return [
            (scope, t.target.value, self.facts.order(assign)) for t in assign.targets if isinstance(t.target, cst.Name)
        ]

    def _check_aliases_before(self, scope: Scope, name: str, after: int) -> None:
        """``model_without_ddp = model`` before the wrap names the unwrapped module: a use of
        it after the wrap trains or saves something RoundPipe does not manage."""
        if after <= 0:
            return
        for access in self.rules._accesses(name, scope):
            parent = self.facts.parent(access)
            if self.rules._runs_after(access, scope, after - 1) or not (
                isinstance(parent, cst.Assign) and parent.value is access
            ):
                continue
            for alias_scope, alias, _ in self._aliases(parent, scope):
                if any(s is alias_scope and n == alias for s, n, _ in self.rules.plan.wrapped_models):
                    continue  # bound again to the RoundPipe model after the wrap (migrate.ddp_guard)
                late = [a for a in self.facts.accesses(alias, alias_scope) if self.facts.order(a) > after]
                if late:
                    raise Blocked(
                        late[0],
                        "RPM114",
                        f"{alias!r} is bound to {name!r} before the "
                        f"RoundPipe wrap and used after it; it still names the unwrapped "
                        f"module (bind it after the wrap, to {name}.model); left untouched",
                    )

    def _check_other_backwards(self) -> None:
        """A backward outside the recognised steps trains the wrapped model another way."""
        steps = self.rules.plan.backward_statements
        if not self.rules.plan.wrapped_models:
            return
        for call in self.facts.backward_calls:
            if any(a in steps for a in self.facts.ancestors(call)) or calls_own_method(self.rules, call):
                continue
            raise Blocked(
                call,
                "RPM115",
                f"`{code(call)}` runs a backward outside the migrated "
                "training step (a second training loop?); with the model wrapped it "
                "would not train through RoundPipe's step; left untouched",
            )

    def _plan_attribute(self, attribute: cst.Attribute, access: cst.Name, name: str) -> None:
        method = attribute.attr.value
        if method == "module":
            raise Blocked(
                attribute,
                "RPM114",
                f"`{name}.module` (a DDP-style inner module) is "
                f"not an attribute of a RoundPipe model (its module is {name}.model); "
                "left untouched",
            )
        if method in ("state_dict", "load_state_dict"):
            self.rules.plan.edits.replace_expression(
                attribute,
                lambda updated: updated.with_changes(value=cst.Attribute(value=updated.value, attr=cst.Name("model"))),
            )
        if method in ("eval", "state_dict") or (method == "load_state_dict" and "." in name):
            # an instance's model may be loaded while its step runs (a local one, before)
            self._synchronize_before(access, name)

    def _plan_inference_call(self, access: cst.Name, name: str) -> None:
        """A model call inside ``with torch.no_grad()``/``inference_mode()`` evaluates: the
        newest weights are synchronized into the model before that block."""
        for ancestor in self.facts.ancestors(access):
            if isinstance(ancestor, cst.With) and any(
                isinstance(item.item, cst.Call) and self.facts.calls_any(item.item, _NO_GRAD) for item in ancestor.items
            ):
                self._synchronize_before(ancestor, name)
                return
        function = self.facts.enclosing(access, (cst.FunctionDef,))
        if "." in name and function is not None:  # an instance's model (`self.D(x)`), with gradients
            self._called_with_grad.setdefault(function, {}).setdefault(name, self.facts.parent(access))

    def _check_steps_reach_one_model(self) -> None:
        """A method holding a training step that also calls another wrapped instance model
        with gradients (a GAN's generator step through the discriminator): that backward
        reaches the other model's parameters, whose gradients RoundPipe's step for the
        first does not hand over or clear as the original did."""
        for backward in sorted(self.rules.plan.backward_statements, key=self.facts.order):
            function = self.facts.enclosing(backward, (cst.FunctionDef,))
            called = self._called_with_grad.get(function, {}) if function is not None else {}
            if len(called) > 1:
                first, second = sorted(called, key=lambda n: self.facts.order(called[n]))[:2]
                raise Blocked(
                    called[second],
                    "RPM107",
                    f"{function.name.value}() holds a training step and calls two wrapped models with "  # type: ignore[union-attr]
                    f"gradients ({first}, {second}): its backward may reach the parameters of both (a GAN "
                    "step?), but each RoundPipe step hands over only its own model's gradients; left untouched",
                )

    def _parameter_target(self, arg: cst.Arg) -> Optional[Tuple[Scope, str, int]]:
        fed = self.rules.parameter_fed_by(arg)
        return (*fed, 0) if fed is not None else None

    def _synchronize_before(self, node: cst.CSTNode, name: str, why: str = "before evaluation/saving") -> None:
        statement = self.facts.statement_of(node)
        block = self.facts.parent(statement)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            return
        body = list(block.body)
        index = body.index(statement)
        earlier = [i for b, i, model in self._synced if b == id(block) and i <= index and model == name]
        if earlier and not any(self._trains(s) for s in body[max(earlier) : index]):
            return  # already synchronized in this block, and no training since
        previous = only_expression(body[index - 1]) if index > 0 else None
        if previous is not None and method_call(previous, name, "synchronize"):
            return
        self._synced.add((id(block), index, name))
        self.rules.plan.edits.insert_before(block, index, [cst.parse_statement(f"{name}.synchronize()\n")])
        self.rules.plan.rewrites.append((statement, f"{name}.synchronize() {why}"))

    @staticmethod
    def _trains(statement: cst.CSTNode) -> bool:
        """The statement may run a training step (a backward or an optimizer step)."""
        return bool(m.findall(statement, m.Call(func=m.Attribute(attr=m.Name("backward") | m.Name("step")))))
