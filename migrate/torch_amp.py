"""Rewrite rules for torch.amp / torch.cuda.amp GradScaler training scripts.

For every GradScaler the module constructs, the rules follow the scaler to each
``scaler.scale(loss).backward()`` and recognise the training step around it:

    [optimizer.zero_grad()]                       # optional, before the forward
    with autocast(...):                           # optional, kept as it is
        out = model(inputs...)                    # the forward: one call of the model
        loss = criterion(out, labels)             # assignments computing the loss
    scaler.scale(loss).backward()
    ...                                           # statements not touching the optimizer
    [if condition:]                               # gradient accumulation
        scaler.unscale_(optimizer); clip...(model.parameters(), ...)
        scaler.step(optimizer); scaler.update()
        optimizer.zero_grad(); model.zero_grad(); scheduler.step()

and rewrite it into the RoundPipe form (a loss function for ``forward_backward``, a step
function for ``model.step``, ``scaler.update()`` on the main thread). The model is wrapped
with ``roundpipe.RoundPipe`` right before the optimizer is built, and the optimizer is built
on ``model.optim_parameters()``. Anything not understood raises :class:`Blocked`, and the
caller leaves the whole file untouched with that diagnostic.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Callable, List, Optional, Set, Tuple, TypeVar, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment, Scope

from .attribute_aliases import element_for, unpacked_into
from .attributes import InstanceAttributes, InstanceFamily
from .class_method_calls import class_method_sites, described, own_class_method
from .edits import drop_keeping_comments
from .either_scaler import first_of_branches
from .foreign_functions import ForeignFunctions
from .handed_in import constructed_init
from .injected import injected_attribute
from .migrated_form import in_autograd_form
from .names import SCALER_STATE_METHODS, ModuleFacts, argument_for
from .plain_path import plan_plain_path
from .plan import Binding, Blocked, Plan
from .returned import returned_name, returned_targets
from .rules.scaler_constructor import drop_unused_scaler_imports, rewrite_constructor
from .scaler_bindings import built_other_part, unfollowed_binding
from .scaler_wrapper import ScalerWrappers, WrapperContext
from .state_helpers import StateHelpers, state_only_parameter
from .state_objects import StateField, StateObjects
from .syntax import (
    calls_method,
    code,
    dotted,
    leading_lines,
    method_call,
    only_assignment,
    only_expression,
    tests_presence,
)
from .torch_two_path import step_builder

__all__ = ["Blocked", "Plan", "TorchAmpRules", "plan_torch_amp"]

T = TypeVar("T")

#: What code outside a trainer class may do with its scaler (``trainer.scaler.get_scale()``).
SCALER_READS = frozenset({"get_scale", "state_dict", "load_state_dict", "is_enabled"})


class TorchAmpRules:
    """Finds GradScalers and their training steps in one module and plans the rewrite."""

    def __init__(
        self,
        facts: ModuleFacts,
        exact: bool,
        state_helpers: StateHelpers = MappingProxyType({}),
        wrappers: Optional[WrapperContext] = None,
        foreign: ForeignFunctions = MappingProxyType({}),
    ) -> None:
        self.facts = facts
        self.foreign = foreign  # functions of other given files it calls (migrate.foreign_functions)
        self.exact = exact
        self.state_helpers = state_helpers  # checkpoint helpers of other files (migrate.state_helpers)
        self.wrappers = wrappers or WrapperContext()
        self.plan = Plan(taken_names=set(facts.all_names))
        self.attributes = InstanceAttributes(facts)
        self.state_objects = StateObjects(facts)  # dataclass/dict states holding the objects
        self._attribute_scalers: Set[Tuple[Optional[InstanceFamily], str]] = set()  # (family, attribute)
        self._step_method_uses: List[cst.BaseExpression] = []
        self.rewritten_constructors: Set[cst.Call] = set()
        self.dropped_imports: Set[int] = set()  # ids of the import statements edited

    # ------------------------------------------------------------------ entry point
    def run(self) -> Plan:
        """Plan every scaler's steps; every independent blocker is kept in ``plan.blocked``
        (checks that would only repeat an earlier blocker's consequences are skipped)."""
        wrappers = ScalerWrappers(self, self.wrappers)
        self._collect(wrappers.run)  # loss-scaler wrapper classes own their scalers
        for call, statement in self._collect(self._find_scalers) or []:
            if call not in wrappers.claimed:
                self._collect(self._plan_scaler, call, statement)
        self._collect(self._reject_untracked_backwards)
        if self.plan.blocked:
            return self.plan
        self._collect(self._reject_unscale_elsewhere)
        drop_unused_scaler_imports(self)
        for access in self._step_method_uses:
            if self.facts.statement_of(access) not in self.plan.step_statements:
                self.plan.blocked.append(
                    Blocked(
                        access,
                        "RPM104",
                        "scaler.unscale_/step/update "
                        "outside a training step the migration recognised; "
                        "migrate this loop by hand",
                    )
                )
        return self.plan

    def _collect(self, check: Callable[..., T], *args: object) -> Optional[T]:
        """Run ``check``; a :class:`Blocked` it raises is recorded, not propagated."""
        try:
            return check(*args)
        except Blocked as blocked:
            self.plan.blocked.append(blocked)
            return None

    def _reject_untracked_backwards(self) -> None:
        """``x.scale(loss).backward()`` whose ``x`` was not followed from a torch GradScaler
        (e.g. a function nobody in this file calls): not certain, so the file is left alone;
        each one is recorded.
        Objects built by a known non-torch call are someone else's and are ignored."""
        pattern = m.Call(
            func=m.Attribute(
                value=m.Call(func=m.Attribute(value=m.Name(), attr=m.Name("scale"))), attr=m.Name("backward")
            )
        )
        already = {self.facts.statement_of(b.node) for b in self.plan.blocked}  # reported there
        for call in self.facts.backward_calls:
            if self.facts.statement_of(call) in self.plan.backward_statements:
                continue
            owner = call.func.value.func.value if self._scaled_on_an_object(call) else None  # type: ignore[attr-defined]
            if owner is not None and self.state_objects.refused(owner):
                continue  # a state object's scaler: RPM125 names the blocker
            if owner is not None and self._state_scaler_not_torch(owner):
                continue  # `state["scaler"]` built as RoundPipe's own (an already migrated file)
            if owner is not None and not self._attribute_scaler_handled(owner):
                where = (
                    "an attribute that no class of this file binds to a GradScaler (a mixin's?)"
                    if self._instance_attribute(owner)
                    else "an attribute or container"
                )
                self.plan.blocked.append(
                    Blocked(
                        call,
                        "RPM104",
                        f"`{code(call.func.value.func)}(...).backward()` scales "  # type: ignore[attr-defined]
                        f"the loss with a scaler held in {where}, which the "
                        "migration does not follow; migrate it by hand",
                    )
                )
                continue
            if not m.matches(call, pattern):
                continue
            statement = self.facts.statement_of(call)
            if statement in self.plan.backward_statements or statement in already:
                continue
            owner = call.func.value.func.value  # type: ignore[attr-defined]  # the shape `pattern` matched
            if self.state_objects.refused(owner):
                continue  # an alias of a state object's scaler: RPM125 names the blocker
            scope = self.facts.scope(owner)
            assignments = [a for a in scope[owner.value] if isinstance(a, Assignment)] if scope is not None else []
            built_elsewhere = all(
                self._built_by_other_call(self._origin(a, call)) or self._alias_of_handled_attribute(a)
                for a in assignments
            )
            if (assignments and built_elsewhere) or in_autograd_form(self.facts, call, owner.value):
                continue
            self.plan.blocked.append(
                Blocked(
                    call,
                    "RPM104",
                    f"`{owner.value}.scale(...).backward()` uses a scaler the "
                    "migration cannot follow back to a torch GradScaler in this file "
                    f"({self._why_not_followed(call, owner.value)}); migrate it by hand",
                )
            )

    def _why_not_followed(self, backward: cst.Call, scaler: str) -> str:
        """Why the scaler of ``backward`` was not followed, as precisely as the file says:
        the binding of the scaler that stopped it (:mod:`migrate.scaler_bindings`), or that
        its function is not called here (a helper of another module's loop), and when that
        function has no ``scaler.step(...)`` either, the step is in another function."""
        function = self.facts.enclosing(backward, (cst.FunctionDef,))
        sites = class_method_sites(self.facts, function) if isinstance(function, cst.FunctionDef) else []
        if isinstance(function, cst.FunctionDef) and sites:  # `cls.train_one_epoch(scaler=scaler)`
            return (
                f"{function.name.value}() is {described(self.facts, function)}, called as "
                f"`{code(sites[0].func)}(...)`; a scaler is not followed into class or static methods"
            )
        owner = backward.func.value.func.value  # type: ignore[attr-defined]  # `scaler.scale(...).backward()`
        if not isinstance(function, cst.FunctionDef) or self._called_here(function):
            binding = unfollowed_binding(self.facts, owner) if isinstance(owner, cst.Name) else None
            return binding or "its binding here is not a GradScaler construction the migration follows"
        steps = [c for c in self.facts.subtree(function, cst.Call) if method_call(c, scaler, "step")]
        split = (
            ""
            if steps
            else "; its optimizer step is not in it either: a backward and its step in different "
            "functions are not migrated"
        )
        return f"{function.name.value}() is not called in this file, its {scaler!r} comes from elsewhere{split}"

    def _called_here(self, function: cst.FunctionDef) -> bool:
        """``function`` is called in this file: by its name, or, for a method, as an attribute
        of that name (``trainer.train_step(x)``, ``self.train_step(x)``)."""
        if self.facts.call_sites(function):
            return True
        if not isinstance(self.facts.parent(self.facts.parent(function)), cst.ClassDef):
            return False
        wanted = function.name.value
        return any(
            isinstance(call.func, cst.Attribute) and call.func.attr.value == wanted
            for call in self.facts.subtree(self.facts.module, cst.Call)
        )

    def _attribute_scaler_handled(self, owner: cst.BaseExpression) -> bool:
        """``self.x`` of ``self.x.scale(loss).backward()`` holds a torch GradScaler whose
        attribute the rules already followed (planned, or reported where it blocked), or
        one built by a known call that is not a torch GradScaler (RoundPipe's own)."""
        family = self.attributes.family_of_attribute(owner) if isinstance(owner, cst.Attribute) else None
        if family is None:
            return False
        if (family, owner.attr.value) in self._attribute_scalers:  # type: ignore[attr-defined]
            return True
        try:
            tracked = family.follow(owner.attr.value, SCALER_READS)  # type: ignore[attr-defined]
            small = tracked.statement.body[0]
            injected = isinstance(small, cst.Assign) and injected_attribute(self, small, self._other_scaler)
        except Blocked:
            return False
        return self._built_by_other_call(tracked.statement) or bool(injected)

    def _alias_of_handled_attribute(self, assignment: Assignment) -> bool:
        """``scaler = self.scaler`` (or ``model, scaler = self.model, self.scaler``) in a
        method, the attribute followed already or holding a scaler that is not torch's
        (RoundPipe's own, as migrated)."""
        node = assignment.node
        small = only_assignment(self.facts.statement_of(node)) if isinstance(node, cst.CSTNode) else None
        value = small.value if small is not None and len(small.targets) == 1 else None
        if isinstance(node, cst.Name) and value is not None:  # `model, scaler = self.model, self.scaler`
            value = element_for(node, self, value)
        return isinstance(value, cst.Attribute) and self._attribute_scaler_handled(value)

    def _other_scaler(self, _: "TorchAmpRules", value: cst.BaseExpression) -> bool:
        """``value`` is a known call that is not a torch GradScaler (RoundPipe's own)."""
        return isinstance(value, cst.Call) and self._known_other_call(value)

    def _state_scaler_not_torch(self, owner: cst.BaseExpression) -> bool:
        """``owner`` (``state["scaler"]``, ``state.scaler``) reads a field of a state object
        whose construction gives it a known call that is not a torch GradScaler, in place or
        through the name it passes (RoundPipe's own, as migrated). Looked for only for such an
        unfollowed read (rare), over the module's state constructions."""
        for build in self.facts.subtree(self.facts.module, (cst.Dict, cst.Call)):
            fields = self.state_objects.fields(build)
            for name, value in (fields or {}).items():
                if not self._other_scaler_value(value, build):
                    continue
                try:
                    reads = self.state_objects.field(build, name).reads  # type: ignore[arg-type]
                except Blocked:
                    continue
                if any(read is owner for read in reads):
                    return True
        return False

    def _other_scaler_value(self, value: cst.BaseExpression, at: cst.CSTNode) -> bool:
        """``value`` is a known call that is not a torch GradScaler, or a name bound to one."""
        if isinstance(value, cst.Call):
            return self._known_other_call(value)
        if not isinstance(value, cst.Name):
            return False
        try:
            return self._built_by_other_call(self.binding(value.value, at).statement)
        except Blocked:
            return False

    @staticmethod
    def _scaled_on_an_object(call: cst.Call) -> bool:
        """``self.scaler.scale(loss).backward()``, ``scalers[i].scale(...).backward()``..."""
        return m.matches(
            call,
            m.Call(
                func=m.Attribute(
                    attr=m.Name("backward"), value=m.Call(func=m.Attribute(attr=m.Name("scale"), value=~m.Name()))
                )
            ),
        )

    def _reject_unscale_elsewhere(self) -> None:
        """``<anything>.unscale_(...)`` outside the recognised steps: a scaler used where the
        migration did not follow it."""
        calls = self.facts.subtree(self.facts.module, cst.Call)
        step_functions = {
            call.args[0].value.value
            for call in calls
            if calls_method(call, "step") and call.args and isinstance(call.args[0].value, cst.Name)
        }
        for call in (call for call in calls if calls_method(call, "unscale_")):
            function = self.facts.enclosing(call, (cst.FunctionDef,))
            if isinstance(function, cst.FunctionDef) and function.name.value in step_functions:
                continue  # already RoundPipe's form: inside a function handed to model.step
            if self.facts.statement_of(call) not in self.plan.step_statements:
                raise Blocked(
                    call,
                    "RPM104",
                    f"`{code(call)}` unscales with a scaler the migration "
                    "did not follow to a recognised training step; migrate it by hand",
                )

    def _origin(self, assignment: Assignment, at: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The node binding a name; for a parameter, the binding every same-file caller
        passes (None when that cannot be followed)."""
        if not isinstance(assignment.node, cst.Param):
            return assignment.node
        try:
            outer = self.caller_binding(Binding(assignment.scope, assignment.name, None, None), at)
        except Blocked:
            return None
        return outer.statement

    def _built_by_other_call(self, node: Optional[cst.CSTNode]) -> bool:
        """``node`` binds the result of a known call that is not a torch GradScaler (e.g.
        RoundPipe's own, possibly ``... if amp else None``)."""
        statement = self.facts.statement_of(node) if isinstance(node, cst.CSTNode) else None
        small = only_assignment(statement)
        value = small.value if small is not None else None
        if isinstance(value, cst.IfExp) and isinstance(value.body, cst.Call) and _optional(value, value.body):
            value = value.body
        return isinstance(value, cst.Call) and self._known_other_call(value)

    def _known_other_call(self, value: cst.Call) -> bool:
        """``value`` calls a known callable that is not a torch GradScaler."""
        try:
            kind = self.facts.scaler_kind(value)
        except ValueError:  # an ambiguous GradScaler spelling is still a GradScaler (RPM104 later)
            return False
        return kind is None and bool(self.facts.qualified(value.func))

    def _find_scalers(self) -> List[Tuple[cst.Call, cst.BaseStatement]]:
        found = []
        for call in self.facts.subtree(self.facts.module, cst.Call):
            try:
                kind = self.facts.scaler_kind(call)
            except ValueError:
                raise Blocked(
                    call,
                    "RPM138",
                    "GradScaler import fallback mixes torch.amp and "
                    "torch.cuda.amp with positional arguments; pass them by keyword",
                )
            if kind is not None:
                found.append((call, self.facts.statement_of(call)))
        return found

    # -------------------------------------------------------------- the scaler itself
    def _plan_scaler(self, call: cst.Call, statement: cst.BaseStatement) -> None:
        given = self.state_objects.field_given(call)
        if given is not None:  # `{"scaler": GradScaler()}`, `TrainState(..., scaler=GradScaler())`
            rewrite_constructor(self, call, self.facts.scaler_kind(call))
            self._follow_scaler(given[1], self.state_objects.field(*given), depth=0)
            return
        small = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
        followed_from = first_of_branches(self.facts, small.value, call) if isinstance(small, cst.Assign) else None
        if followed_from not in (None, call):  # `GradScaler(a) if c else GradScaler(b)`: followed from `a`'s
            rewrite_constructor(self, call, self.facts.scaler_kind(call))
            return
        if not (
            isinstance(statement, cst.SimpleStatementLine)  # not a walrus in an if/while header
            and len(statement.body) == 1
            and isinstance(small, cst.Assign)
            and (small.value is call or _optional(small.value, call) or followed_from is call)
            and len(small.targets) == 1
            and (isinstance(small.targets[0].target, cst.Name) or self._instance_attribute(small.targets[0].target))
        ):
            if isinstance(small, cst.Assign) and isinstance(small.value, (cst.IfExp, cst.BooleanOperation)):
                rewrite_constructor(self, call, self.facts.scaler_kind(call))
                self._follow_injected(small, call, 0)  # `self.scaler = scaler or GradScaler()`
                return
            raise Blocked(
                call,
                "RPM105",
                "GradScaler is not assigned to a plain variable "
                "(attribute, container or expression); migrate this one by hand",
            )
        target = small.targets[0].target
        kind = self.facts.scaler_kind(call)
        scope: Union[InstanceFamily, Scope, None]
        if isinstance(target, cst.Attribute):  # `self.scaler = GradScaler(...)` in a method
            family = self.attributes.family_of_attribute(target)
            assert family is not None  # _instance_attribute(target) held
            self._attribute_scalers.add((family, target.attr.value))
            name, scope = family.follow(target.attr.value, SCALER_READS).reference, family
        else:
            name, scope = cst.ensure_type(target, cst.Name).value, self.facts.scope(small)
        rewrite_constructor(self, call, kind)
        self._follow_scaler(name, scope, depth=0)

    def _refuse_injected(self, assign: cst.Assign, at: cst.CSTNode) -> None:
        """``self.scaler = scaler if scaler is not None else GradScaler()``, ``... or
        GradScaler()``, or ``self.scaler = scaler`` after ``if scaler is None: scaler =
        GradScaler()``: the attribute may hold a scaler handed in by the caller."""
        if not self._reported_here(assign):
            return
        other = built_other_part(self.facts, assign.value)
        if other is not None:
            raise Blocked(
                at,
                "RPM120",
                f"`{code(self.facts.statement_of(assign)).strip()}` may hold `{code(other)}`, built here and not "
                "a torch GradScaler, instead of this GradScaler; build a GradScaler in every branch "
                "(`GradScaler(enabled=False)` for the plain path), or migrate by hand",
            )
        raise Blocked(
            at,
            "RPM120",
            f"`{code(self.facts.statement_of(assign)).strip()}` may keep a scaler handed in by the caller "
            "(built elsewhere, so not followed) instead of this GradScaler; build the scaler in the "
            "class unconditionally, or migrate by hand",
        )

    def _reported_here(self, assign: cst.Assign) -> bool:
        """Mark the instance attributes ``assign`` binds as reported (their backwards are not
        reported again); False when it binds none."""
        attributes = [t.target for t in assign.targets if isinstance(t.target, cst.Attribute)]
        families = [(self.attributes.family_of_attribute(a), a.attr.value) for a in attributes]
        followed = [(family, attr) for family, attr in families if family is not None]
        self._attribute_scalers.update(followed)
        return bool(followed)

    def _follow_injected(self, assign: cst.Assign, at: cst.CSTNode, depth: int) -> None:
        """``self.scaler = scaler`` in ``__init__``: the attribute, once, when every scaler
        it can hold is followed from this module (:mod:`migrate.injected`); else refused."""
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        family = self.attributes.family_of_attribute(target) if isinstance(target, cst.Attribute) else None
        if family is not None and (family, target.attr.value) in self._attribute_scalers:  # type: ignore[union-attr]
            return  # followed, or reported, from another scaler reaching it
        try:
            found = injected_attribute(self, assign)
        except Blocked:
            self._reported_here(assign)
            raise
        if found is None:
            self._refuse_injected(assign, at)
            return
        family, attr = found
        self._attribute_scalers.add((family, attr))
        self._follow_scaler(family.follow(attr, SCALER_READS).reference, family, depth + 1)

    def _instance_attribute(self, target: cst.BaseExpression) -> bool:
        """``self.x``, with ``self`` the instance parameter of a method of a class."""
        return isinstance(target, cst.Attribute) and self.attributes.family_of_attribute(target) is not None

    def accesses(self, name: str, scope) -> List[cst.BaseExpression]:
        """Every read of ``name`` (a plain name bound in ``scope``, or an instance
        attribute's reference in its family), in source order."""
        if isinstance(scope, InstanceFamily):
            return list(scope.follow(name.partition(".")[2]).reads)
        if isinstance(scope, StateField):
            return list(scope.reads)
        return list(self.facts.accesses(name, scope))

    def assignments(self, name: str, scope) -> List[cst.CSTNode]:
        """The nodes binding ``name`` in ``scope`` (an instance family: its one binding)."""
        if isinstance(scope, InstanceFamily):
            return [scope.follow(name.partition(".")[2]).statement]
        if isinstance(scope, StateField):
            return [self.facts.statement_of(scope.build)]
        return self.facts.assignments(name, scope)

    def runs_after(self, node: cst.CSTNode, scope, after: int) -> bool:
        """``node`` (a read of a name bound in ``scope``) may run after the statement at
        source rank ``after``: later in source order; in an instance family, in another
        method too."""
        if isinstance(scope, InstanceFamily):
            return scope.runs_after(node, after)
        if isinstance(scope, StateField):
            return True  # read wherever the state object goes
        return self.facts.order(node) > after

    def reference(self, node: Optional[cst.CSTNode]) -> Optional[str]:
        """The name the rules follow ``node`` as (see :meth:`InstanceAttributes.reference`)."""
        return self.attributes.reference(node) or self.state_objects.reference(node)

    def _follow_scaler(self, name: str, scope, depth: int) -> None:
        """Check every use of the scaler variable; plan each training step it drives."""
        if depth > 4:
            raise Blocked(scope.node, "RPM104", "GradScaler passed through too many functions")
        for access in self.accesses(name, scope):
            parent = self.facts.parent(access)
            given = self.state_objects.field_given(access)
            if isinstance(scope, StateField):  # read as `state.scaler`: that is its name here
                name = dotted(access) or code(access)
            if given is not None:  # put in a state object: its reads are the scaler's
                self._follow_scaler(given[1], self.state_objects.field(*given), depth + 1)
            elif isinstance(parent, cst.Attribute) and parent.value is access:
                method = parent.attr.value
                if method == "scale":
                    self._collect(self._plan_backward, access, name)  # each step: its own blocker
                elif method in ("unscale_", "step", "update"):
                    self._step_method_uses.append(access)
                elif method in SCALER_STATE_METHODS:
                    continue
                else:
                    raise Blocked(access, "RPM104", f"GradScaler method {method!r} is not migrated")
            elif isinstance(parent, cst.Arg):
                self._follow_into_function(parent, name, depth)
            elif tests_presence(parent, access):
                continue  # `if scaler is not None:`, `if scaler:`: optional AMP
            elif (targets := returned_targets(self.facts, access)) is not None:
                for target_scope, target, _ in targets:  # `return model, scaler` of a setup function
                    self._follow_scaler(target, target_scope, depth + 1)
            elif isinstance(parent, cst.Assign) and parent.value is access:
                self._follow_injected(parent, access, depth)
                for bound in parent.targets:  # `amp_scaler = state["scaler"]`: the same scaler
                    scope_here = self.facts.scope(parent)
                    if isinstance(bound.target, cst.Name) and scope_here is not None:
                        self._follow_scaler(bound.target.value, scope_here, depth + 1)
            elif isinstance(parent, (cst.IfExp, cst.BooleanOperation)) and isinstance(
                assign := self.facts.parent(parent), cst.Assign
            ):  # `self.scaler = scaler if scaler is not None else GradScaler()`
                self._follow_injected(assign, access, depth)
            elif (unpacked := unpacked_into(self.facts, access)) is not None and (
                scope_here := self.facts.scope(unpacked)
            ) is not None:  # `model, scaler = self.model, self.scaler`: the same scaler
                self._follow_scaler(unpacked.value, scope_here, depth + 1)
            else:
                raise Blocked(
                    access,
                    "RPM105",
                    "GradScaler is stored or passed in a way the migration cannot follow; migrate this one by hand",
                )

    def _follow_into_function(self, arg: cst.Arg, name: str, depth: int) -> None:
        call = self.facts.parent(arg)
        assert call is not None  # an argument's call
        function = self.facts.local_function(call) or constructed_init(self.facts, call)  # `Trainer(scaler=...)`
        if function is None:
            if isinstance(call, cst.Call) and state_only_parameter(self.state_helpers, call, arg) is not None:
                return  # a checkpoint helper of another file: the scaler's state dict is torch's
            own = own_class_method(self.facts, call)
            if own is not None:  # `cls.train_one_epoch(scaler=scaler)`
                raise Blocked(
                    arg,
                    "RPM104",
                    f"GradScaler passed to {own.name.value}(), {described(self.facts, own)}; a scaler "
                    "is not followed into class or static methods; migrate this step by hand",
                )
            raise Blocked(
                arg,
                "RPM104",
                "GradScaler passed to a function defined elsewhere; "
                "training steps spread over several files are not migrated",
            )
        assert isinstance(call, cst.Call)  # local_function found the function it calls
        param = self._parameter_for(call, function, arg)
        self._follow_scaler(param, self.facts.scope(function.body.body[0]), depth + 1)

    def parameter_fed_by(self, arg: cst.Arg) -> Optional[Tuple[Scope, str]]:
        """(the scope, the parameter) of the same-file function that the call around ``arg``
        feeds it to; None when the callee is not a function of this file or the argument
        cannot be matched to one parameter."""
        call = self.facts.parent(arg)
        function = self.facts.local_function(call) if isinstance(call, cst.Call) else None
        if function is None or not isinstance(call, cst.Call) or not function.body.body:
            return None
        try:
            param = self._parameter_for(call, function, arg)
        except Blocked:
            return None
        scope = self.facts.scope(function.body.body[0])
        return (scope, param) if scope is not None else None

    def _parameter_for(self, call: cst.Call, function: cst.FunctionDef, arg: cst.Arg) -> str:
        names = [p.name.value for p in function.params.params]
        if self.facts.local_function(call) is not function:  # `Class(...)` calls its __init__ without `self`
            names = names[1:]
        if arg.keyword is not None:
            return arg.keyword.value
        index = list(call.args).index(arg)
        if arg.star or index >= len(names):
            raise Blocked(arg, "RPM104", "GradScaler passed through *args; migrate by hand")
        return names[index]

    # ------------------------------------------------- optimizer -> model binding
    def binding(self, name: str, at: cst.CSTNode) -> Binding:
        """Where ``name`` read at ``at`` is bound (a state object's field, an instance
        attribute, or a name of the file). Raises :class:`Blocked` when no one binding is found."""
        held = self.state_objects.binding(name, at, self.binding) if "." in name or "[" in name else None
        if held is not None:  # `state.optimizer`: what the state object's construction gives
            return held
        if "." in name:  # `self.optimizer`: bound once in a method of the class
            return self.attributes.binding(name, at)
        scope = self.facts.scope(at)
        assignments = [a for a in scope[name] if hasattr(a, "node")] if scope is not None else []
        if not assignments:  # unbound, or a builtin (`print`)
            raise Blocked(at, "RPM108", f"{name!r} is not defined in this file")
        # the binding that reaches `at`: the last one before it, else (a loop) the last one
        before = [a for a in assignments if self.facts.order(a.node) < self.facts.order(at)]
        assignment = max(before or assignments, key=lambda a: self.facts.order(a.node))
        node = assignment.node
        if isinstance(node, cst.Param):
            return Binding(assignment.scope, name, None, None)
        if not isinstance(node, cst.CSTNode) or isinstance(node, (cst.Import, cst.ImportFrom)):
            raise Blocked(at, "RPM108", f"{name!r} is not built in this file")
        statement = self.facts.statement_of(node)
        value = None
        small = only_assignment(statement)
        if small is not None and len(small.targets) == 1:
            value = small.value
            inner = returned_name(self.facts, small, name)  # `model, optimizer = build()`
            if inner is not None:
                return self.binding(inner.value, inner)
        return Binding(assignment.scope, name, statement, value)

    def caller_binding(self, binding: Binding, at: cst.CSTNode, depth: int = 0) -> Binding:
        """Follow a function parameter to the one binding every same-file caller passes."""
        function = self.facts.function_of(binding.scope)
        if function is None or depth > 4:
            raise Blocked(at, "RPM108", f"cannot follow {binding.name!r} to where it is built")
        sites = self.facts.call_sites(function)
        if not sites:
            raise Blocked(
                function,
                "RPM108",
                f"{function.name.value}() is not called in this file; its model/optimizer cannot be followed",
            )
        found: Optional[Binding] = None
        for site in sites:
            value = argument_for(site, function, binding.name)
            if not isinstance(value, cst.Name):
                raise Blocked(site, "RPM108", f"{binding.name!r} is not passed as a plain name")
            outer = self.binding(value.value, site)
            if outer.statement is None:
                outer = self.caller_binding(outer, site, depth + 1)
            if found is not None and outer.statement is not found.statement:
                raise Blocked(
                    site, "RPM107", f"{function.name.value}() is called with different objects for {binding.name!r}"
                )
            found = outer
        assert found is not None  # sites is not empty
        return found

    def constructed(self, name: str, at: cst.CSTNode) -> Binding:
        """:meth:`binding`, followed through a parameter to what the callers pass."""
        binding = self.binding(name, at)
        if binding.statement is None:
            binding = self.caller_binding(binding, at)
        return binding

    # ------------------------------------------------------------ removing statements
    def drop_line(self, statement: cst.SimpleStatementLine) -> None:
        """Remove an import line; an import guard left empty goes too, another block gets
        ``pass``."""
        block = self.facts.parent(statement)
        assert isinstance(block, (cst.IndentedBlock, cst.Module))  # a line's block
        body = list(block.body)
        guard = self.facts.parent(block)
        if len(body) == 1 and self._import_guard(guard):
            self.drop_statement(cst.ensure_type(guard, cst.Try))
            return
        if isinstance(block, cst.IndentedBlock) and len(body) == 1:
            keep = cst.ensure_type(cst.parse_statement("pass\n"), cst.SimpleStatementLine)
            self.plan.edits.replace_range(
                block,
                0,
                1,
                lambda updated: [
                    keep.with_changes(
                        leading_lines=leading_lines(updated[0]),
                        trailing_whitespace=getattr(updated[0], "trailing_whitespace", keep.trailing_whitespace),
                    )
                ],
            )
        else:
            self.drop_statement(statement)

    def drop_statement(self, statement: cst.BaseStatement) -> None:
        """Remove ``statement`` from its block, keeping its comments."""
        block = self.facts.parent(statement)
        assert isinstance(block, (cst.IndentedBlock, cst.Module))  # a statement's block
        index = list(block.body).index(statement)
        self.plan.edits.replace_range(block, index, index + 1, drop_keeping_comments)

    @staticmethod
    def _import_guard(node: Optional[cst.CSTNode]) -> bool:
        """A ``try`` whose handlers only catch a failed import, with no else/finally."""
        if not isinstance(node, cst.Try) or node.orelse is not None or node.finalbody is not None:
            return False
        names = []
        for handler in node.handlers:
            kinds = handler.type.elements if isinstance(handler.type, cst.Tuple) else [handler.type]
            names += [code(k.value if isinstance(k, cst.Element) else k) for k in kinds if k is not None]
        return bool(names) and all(n in ("ImportError", "ModuleNotFoundError") for n in names)

    # -------------------------------------------------------------- training steps
    def _plan_backward(self, access: cst.Name, scaler: str) -> None:
        scale_call = self.facts.parent(self.facts.parent(access))
        backward_attr = self.facts.parent(scale_call)
        backward_call = self.facts.parent(backward_attr)
        statement = self.facts.statement_of(access)
        if statement in self.plan.backward_statements:
            return  # reached again (the function is called twice, or with another scaler)
        if not (
            isinstance(scale_call, cst.Call)
            and isinstance(backward_attr, cst.Attribute)
            and backward_attr.attr.value == "backward"
            and isinstance(backward_call, cst.Call)
            and only_expression(statement) is backward_call
            and isinstance(statement, cst.SimpleStatementLine)  # it is where only_expression is not None
        ):
            raise Blocked(
                access, "RPM130", "scaler.scale(...) is not used as `scaler.scale(loss).backward()` on its own line"
            )
        for arg in backward_call.args:
            if arg.keyword is not None and arg.keyword.value == "retain_graph":
                continue  # kept as written: the step takes the autograd form (multi_step.check_fusable)
            if arg.keyword is not None and arg.keyword.value == "create_graph":
                raise Blocked(
                    backward_call,
                    "RPM103",
                    "backward(create_graph=True) (higher-order gradients) has no RoundPipe form; left untouched",
                )
            raise Blocked(backward_call, "RPM130", "backward() with arguments is not migrated")
        if len(scale_call.args) != 1:
            raise Blocked(scale_call, "RPM130", "scaler.scale() of several outputs is not migrated")
        step = step_builder(self, scaler, statement, scale_call.args[0].value)
        step.plan()
        plan_plain_path(step)


def _optional(value: cst.BaseExpression, call: cst.Call) -> bool:
    """``GradScaler(...) if flag else None`` (either way round): optional AMP."""
    if not isinstance(value, cst.IfExp):
        return False
    other = value.orelse if value.body is call else value.body if value.orelse is call else None
    return other is not None and m.matches(other, m.Name("None"))


def plan_torch_amp(
    facts: ModuleFacts,
    exact: bool,
    state_helpers: StateHelpers = MappingProxyType({}),
    wrappers: Optional[WrapperContext] = None,
    foreign: ForeignFunctions = MappingProxyType({}),
) -> Tuple[Plan, TorchAmpRules]:
    """Plan the rewrite of every torch GradScaler training step in the module
    (``state_helpers``: checkpoint helpers of other files it calls; ``wrappers``: what the
    other files of the project say about its loss-scaler wrapper classes; ``foreign``: the
    functions of other given files it calls)."""
    rules = TorchAmpRules(facts, exact, state_helpers, wrappers, foreign)
    return rules.run(), rules
