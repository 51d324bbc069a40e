"""Loss-scaler wrapper classes (issue 10, shape 2), recognised as a whole and migrated with
every place that builds or calls them.

The shape (MAE/BEiT/DeiT/ConvNeXt's ``NativeScalerWithGradNormCount``, timm's
``NativeScaler``): a class whose ``__init__`` stores a torch GradScaler on ``self`` and whose
``__call__(loss, optimizer, ...)`` runs ``self._scaler.scale(loss).backward(...)``, then, on
update steps (an ``if update_grad:`` block, or after an early ``return``), the optimizer work
(``unscale_``, clipping or a grad-norm helper, ``self._scaler.step(optimizer)``) and
``self._scaler.update()``; it may return what the optimizer work computed (the grad norm).
Its other methods may use the scaler's state (``state_dict``, ``load_state_dict``,
``get_scale``...).

The migrated class keeps its interface and state, and is given the RoundPipe model it steps
as a keyword-only constructor argument ``model`` (decided here: the wrapper is built where
the model and its optimizer are, so the construction is the one place that knows the model;
a ``model=`` argument at every call would have to be threaded through functions that only
receive the wrapper):

    def __init__(self, ..., *, model):
        self._model = model
        self._scaler = roundpipe.GradScaler(...)

    def __call__(self, loss, optimizer, ...):
        self._scaler.scale(loss).backward(create_graph=create_graph)   # main thread, as written
        if update_grad:
            norm = None

            def _step_fn():
                nonlocal norm
                ...unscale_, clipping, norm, self._scaler.step(optimizer)...

            self._model.step(_step_fn, is_async=False)
            self._scaler.update()
        ...

This is RoundPipe's autograd form: the backward accumulates the gradients that
``model.step`` hands to the optimizer copies. The step is waited for (``is_async=False``)
under ``--exact``, and always when ``__call__`` returns a value the step function computes
(the norm must exist when the call returns). Where it is built, the model is wrapped with
``roundpipe.RoundPipe`` before its optimizer, the optimizer takes ``model.optim_parameters()``
and the construction gets ``model=model``; at every call ``parameters=model.parameters()``
becomes ``model.optim_parameters()``; a model handed to a checkpoint helper of another file
is handed as ``model.model`` after ``model.synchronize()`` (by :class:`migrate.model_uses.ModelUses`,
as for every wrapped model).

A class that holds a GradScaler on ``self`` and defines ``__call__`` but does anything else
is refused precisely (RPM111). A class already in this form (``roundpipe.GradScaler``) is
left alone. Optimizer wrapper classes (no ``__call__``; ``backward``/``step``/``zero_grad``
methods, fairseq's shape) are recognised and planned by :mod:`migrate.optimizer_wrapper_class`;
their constructions and instances are handled here like a loss-scaler wrapper's. Pure source
analysis: never imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment, Scope
from libcst.metadata.scope_provider import LocalScope

from .amp_helper_class import (
    AmpHelperClass,
    never_an_optimizer,
    plan_amp_helper,
    plan_helper_users,
    recognise_amp_helper,
)
from .names import SCALER_STATE_METHODS
from .optimizer_wrapper_class import (
    OptimizerWrapperClass,
    check_gradient_reads_after_steps,
    check_instance_uses,
    order_handed_optimizer_writes,
    plan_optimizer_wrapper,
    recognise_optimizer_wrapper,
)
from .optimizer_writes import is_scheduler, optimizer_writes
from .plain_path import PlainStepBuilder, plan_plain_path
from .plan import Binding, Blocked
from .rules.model_wrap import plan_model_wrap
from .rules.model_zero_grad import plan_model_zeroing
from .rules.scaler_constructor import rewrite_constructor
from .syntax import (
    PARAMETERS_CALL,
    bare_method_call,
    code,
    dotted,
    is_docstring,
    leading_lines,
    only_assignment,
    only_expression,
)

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["WrapperContext", "WrapperClass", "ScalerWrappers"]

#: Loss-scaler wrappers of libraries the tool knows -> their RoundPipe drop-in.
LIBRARY_WRAPPERS: Dict[str, str] = {
    "timm.utils.NativeScaler": "roundpipe.compat.NativeScaler",
    "timm.utils.cuda.NativeScaler": "roundpipe.compat.NativeScaler",
}

#: the nodes whose ``target`` is what an assignment binds
_TARGETS = (cst.AssignTarget, cst.AugAssign, cst.AnnAssign)


@dataclass(frozen=True)
class WrapperContext:
    """What the other given files say about this file's wrapper classes and their users.

    ``classes``: names bound in this file to wrapper classes of another file;
    ``built_elsewhere``: wrapper classes defined here and built in another file;
    ``instance_params``: ``(function, parameter)`` of this file that another file feeds a
    wrapper instance; ``optimizer_like`` and ``optimizer_params``: those of ``classes`` and
    ``instance_params`` that are optimizer wrappers (:mod:`migrate.optimizer_wrapper_class`);
    ``helper_roles``: the method roles of those of ``classes`` that are AMP helpers
    (:mod:`migrate.amp_helper_class`), ``helper_params`` those of the helper instances other
    files feed to parameters here."""

    classes: FrozenSet[str] = frozenset()
    built_elsewhere: FrozenSet[str] = frozenset()
    instance_params: FrozenSet[Tuple[str, str]] = frozenset()
    optimizer_like: FrozenSet[str] = frozenset()  # of ``classes``: the optimizer wrappers
    optimizer_params: FrozenSet[Tuple[str, str]] = frozenset()  # of ``instance_params``: fed one of those
    helper_roles: FrozenSet[Tuple[str, str, str]] = frozenset()  # (class of ``classes``, method, role): AMP helpers
    helper_params: FrozenSet[Tuple[str, str, str, str]] = frozenset()  # (function, parameter, method, role)


@dataclass
class WrapperClass:
    """A recognised wrapper class: ``scaler`` is the attribute holding its GradScaler;
    ``moved`` the statements of ``__call__`` that become the step function
    (``block.body[start:update]``, ``update`` the index of ``self.<scaler>.update()``)."""

    node: cst.ClassDef
    scaler: str
    constructors: Tuple[cst.Call, ...]  # one, or the branches of a try/except fallback
    init: cst.FunctionDef
    call: cst.FunctionDef
    backward: cst.SimpleStatementLine
    block: cst.BaseSuite
    start: int
    update: int
    returned: Set[str] = field(default_factory=set)  # names the step binds and the call reads after
    unbound: Set[str] = field(default_factory=set)  # of those, the ones __call__ binds nowhere else


class ScalerWrappers:
    """Recognises the module's wrapper classes and plans them and their users."""

    def __init__(self, rules: "TorchAmpRules", context: WrapperContext) -> None:
        self.rules = rules
        self.facts = rules.facts
        self.plan = rules.plan
        self.context = context
        self.claimed: Set[cst.CSTNode] = set()  # GradScaler calls the wrappers own
        self._library_names: Optional[Set[str]] = None  # names imports bind to a NativeScaler

    # --------------------------------------------------------------------- classes
    def run(self) -> None:
        wrappers: Dict[str, Union[WrapperClass, OptimizerWrapperClass, AmpHelperClass]] = {}
        for node in self.facts.subtree(self.facts.module, cst.ClassDef):
            found = self._recognise(node) or recognise_optimizer_wrapper(self, node) or recognise_amp_helper(self, node)
            if found is not None:
                wrappers[node.name.value] = found
        built = self._plan_users(set(wrappers) | set(self.context.classes))
        helpers: Dict[str, Dict[str, str]] = {}
        for owner, method, role in self.context.helper_roles:
            helpers.setdefault(owner, {})[method] = role
        helpers.update({n: w.roles for n, w in wrappers.items() if isinstance(w, AmpHelperClass)})
        plan_helper_users(self, helpers)
        defined = {n: w.node for n, w in wrappers.items() if isinstance(w, OptimizerWrapperClass)}
        check_instance_uses(self, set(defined) | set(self.context.optimizer_like), defined)
        check_gradient_reads_after_steps(self, set(defined) | set(self.context.optimizer_like))
        for name, wrapper in wrappers.items():
            kind = {WrapperClass: "loss-scaler", OptimizerWrapperClass: "optimizer"}.get(type(wrapper), "AMP helper")
            if name not in built and name not in self.context.built_elsewhere:
                raise Blocked(
                    wrapper.node,
                    "RPM111",
                    f"{kind} wrapper {name} is migrated together with the code that builds it, "
                    "which is not among the given files; run the tool on the whole project",
                )
            if isinstance(wrapper, WrapperClass):
                self._plan_class(wrapper)
            elif isinstance(wrapper, AmpHelperClass):
                plan_amp_helper(self, wrapper)
            else:
                plan_optimizer_wrapper(self, wrapper)

    def _recognise(self, node: cst.ClassDef) -> Optional[WrapperClass]:
        """The wrapper in ``node``, None when it is not a scaler wrapper or is one already
        in RoundPipe form; Blocked (RPM111) when it holds a torch GradScaler on ``self``
        and defines ``__call__`` but is not of the recognised shape."""
        methods = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
        call = methods.get("__call__")
        stored = self.claim_torch_scalers(node) if call is not None else []
        if call is None or not stored:
            return None
        attributes = {a for a, _ in stored}
        init = methods.get("__init__")
        if len(attributes) != 1 or init is None or not all(self.facts.within(c, init) for _, c in stored):
            raise Blocked(
                stored[0][1],
                "RPM111",
                f"loss-scaler wrapper {node.name.value}: its GradScaler must be built in __init__, "
                f"as `self.<name> = GradScaler(...)` (a try/except fallback may build it twice); not migrated",
            )
        scaler = attributes.pop()
        wrapper = self._recognise_call(node, scaler, tuple(c for _, c in stored), init, call)
        self._check_other_methods(node, scaler, wrapper)
        return wrapper

    def claim_torch_scalers(self, node: cst.ClassDef) -> List[Tuple[str, cst.Call]]:
        """The ``(attribute, torch GradScaler call)`` pairs the wrapper class ``node`` stores
        on ``self``, claimed for it together with its backwards; empty when it stores no
        scaler, or RoundPipe's (already migrated: its backwards are claimed all the same)."""
        stored = self._stored_scalers(node)
        if not stored:
            return []
        migrated = any("roundpipe.GradScaler" in self.facts.qualified(c.func) for _, c in stored)
        if not migrated and not any(self._torch_scaler(c) for _, c in stored):
            return []
        self._claim_backwards(node)
        if migrated:
            return []
        self.claimed.update(c for _, c in stored)
        return stored

    def _stored_scalers(self, node: cst.ClassDef) -> List[Tuple[str, cst.Call]]:
        """``(attribute, GradScaler call)`` for each ``self.<attribute> = <GradScaler>(...)``
        in the class (torch's or RoundPipe's)."""
        found = []
        for assign in self.facts.subtree(node, cst.Assign):
            value = assign.value
            if (
                isinstance(value, cst.Call)
                and len(assign.targets) == 1
                and m.matches(assign.targets[0].target, m.Attribute(value=m.Name("self"), attr=m.Name()))
                and (self._torch_scaler(value) or "roundpipe.GradScaler" in self.facts.qualified(value.func))
            ):
                found.append((assign.targets[0].target.attr.value, value))  # type: ignore[attr-defined]
        return found

    def _torch_scaler(self, call: cst.Call) -> bool:
        try:
            return self.facts.scaler_kind(call) is not None
        except ValueError:  # the spelling the scaler rules refuse
            raise Blocked(
                call,
                "RPM138",
                "GradScaler import fallback mixes torch.amp and torch.cuda.amp with positional arguments; "
                "pass them by keyword",
            )

    def _claim_backwards(self, node: cst.ClassDef) -> None:
        """The backwards of a wrapper class are the wrapper's: recognised when it is already
        in RoundPipe form or migrated, reported as the wrapper's (RPM111) when refused, never
        as a scaler held on an object."""
        for call in self.facts.backward_calls:
            if self.facts.within(call, node):
                self.plan.backward_statements.add(self.facts.statement_of(call))

    def _recognise_call(
        self,
        node: cst.ClassDef,
        scaler: str,
        constructors: Tuple[cst.Call, ...],
        init: cst.FunctionDef,
        call: cst.FunctionDef,
    ) -> WrapperClass:
        name = node.name.value

        def refuse(at: cst.CSTNode, why: str) -> Blocked:
            return Blocked(at, "RPM111", f"loss-scaler wrapper {name}: {why}; not migrated (migrate it by hand)")

        params = [p.name.value for p in call.params.params]
        if len(params) < 3 or params[0] != "self":
            raise refuse(call, "__call__ must take (self, loss, optimizer, ...)")
        loss, optimizer = params[1], params[2]
        backward = _first_statement(call)
        backward_call = only_expression(backward) if backward is not None else None
        scale = m.Call(
            func=m.Attribute(
                value=m.Call(
                    func=m.Attribute(
                        value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler)), attr=m.Name("scale")
                    ),
                    args=[m.Arg(value=m.Name(loss), keyword=None)],
                ),
                attr=m.Name("backward"),
            ),
            args=m.OneOf([], [m.Arg(keyword=m.Name("create_graph"), value=m.Name())]),
        )
        if backward is None or backward_call is None or not m.matches(backward_call, scale):
            raise refuse(call, f"__call__ must start with `self.{scaler}.scale({loss}).backward()`")
        assert isinstance(backward, cst.SimpleStatementLine)
        updates = [c for c in self._scaler_calls(call, scaler) if c.func.attr.value == "update"]  # type: ignore[attr-defined]
        if len(updates) != 1:
            raise refuse(call, f"__call__ must call self.{scaler}.update() once")
        update_line = self.facts.statement_of(updates[0])
        block = self.facts.parent(update_line)
        if only_expression(update_line) is not updates[0] or not isinstance(block, cst.IndentedBlock):
            raise refuse(updates[0], f"self.{scaler}.update() must be a statement of its own")
        body = list(block.body)
        update = body.index(update_line)
        start = self._step_start(call, backward, block, body, refuse)
        moved = body[start:update]
        self._check_moved(moved, scaler, optimizer, self._settings(node, init), refuse, update_line)
        self._check_outside(call, scaler, backward, block, start, update, refuse)
        wrapper = WrapperClass(node, scaler, constructors, init, call, backward, block, start, update)
        wrapper.returned = self._names_read_after(call, moved)
        wrapper.unbound = wrapper.returned - self._bound(call, outside=moved)
        return wrapper

    def _step_start(self, call: cst.FunctionDef, backward, block, body, refuse) -> int:
        """Where the step function's statements begin: the top of the ``if`` body holding
        the update, or (update in the function body) after the backward and any early
        ``if ...: return`` guards."""
        function_body = call.body
        if block is function_body:
            start = body.index(backward) + 1
            while start < len(body) and _returns_only(body[start]):
                start += 1
            return start
        guard = self.facts.parent(block)
        if not (isinstance(guard, cst.If) and self.facts.parent(guard) is function_body and guard.body is block):
            raise refuse(block, "the optimizer work must sit in the body of __call__ or of one `if` in it")
        if list(function_body.body).index(guard) <= list(function_body.body).index(backward):
            raise refuse(guard, "the optimizer work must come after the backward")
        return 0

    def _check_moved(self, moved, scaler: str, optimizer: str, settings: Set[str], refuse, update_line) -> None:
        """The step function's statements: exactly one ``self.<scaler>.step(optimizer)``
        among them at the top level, the scaler used only by ``unscale_(optimizer)`` and
        that step, no ``return``/``yield``/``nonlocal``/``global``."""
        steps = [s for s in moved if _is_scaler_call(only_expression(s), scaler, "step", optimizer)]
        if len(steps) != 1:
            raise refuse(
                update_line, f"the optimizer work must call self.{scaler}.step({optimizer}) once, before update()"
            )
        for statement in moved:
            if self.facts.subtree(statement, (cst.Return, cst.Yield, cst.Nonlocal, cst.Global)):
                raise refuse(statement, "the optimizer work returns or rebinds outer names")
            for scaler_call in self._scaler_calls(statement, scaler):
                if not (
                    _is_scaler_call(scaler_call, scaler, "unscale_", optimizer)
                    or _is_scaler_call(scaler_call, scaler, "step", optimizer)
                ):
                    raise refuse(scaler_call, f"`{code(scaler_call)}` in the optimizer work is not migrated")
            self._check_uses_of_self(statement, scaler, settings, refuse)

    def _check_uses_of_self(self, statement: cst.CSTNode, scaler: str, settings: Set[str], refuse) -> None:
        """The step function may read the wrapper's settings (attributes only ``__init__``
        assigns, such as a clipping norm), not call its methods or touch other state."""
        for attribute in self._self_attributes(statement):
            name = attribute.attr.value
            parent = self.facts.parent(attribute)
            called = isinstance(parent, cst.Call) and parent.func is attribute
            if name != scaler and (called or name not in settings):
                raise refuse(
                    attribute, f"the optimizer work uses `{code(attribute)}`, which the step function would share"
                )
        for reference in (n for n in self.facts.subtree(statement, cst.Name) if n.value == "self"):
            parent = self.facts.parent(reference)
            if not isinstance(parent, cst.Attribute):
                raise refuse(statement, "the optimizer work hands `self` on")

    def _settings(self, node: cst.ClassDef, init: cst.FunctionDef) -> Set[str]:
        """Attributes of ``self`` that ``__init__`` assigns and no other method does."""
        assigned: Dict[str, bool] = {}
        for target in self.facts.subtree(node, _TARGETS):
            for attribute in self._self_attributes(target.target):  # type: ignore[attr-defined]
                name = attribute.attr.value
                assigned[name] = assigned.get(name, True) and self.facts.within(target, init)
        return {name for name, only_init in assigned.items() if only_init}

    def _check_outside(self, call, scaler: str, backward, block, start: int, update: int, refuse) -> None:
        """Outside the backward and the step's statements, ``__call__`` does not use the
        scaler."""
        inside: List[cst.CSTNode] = [backward, *list(block.body)[start : update + 1]]
        for scaler_call in self._scaler_calls(call, scaler):
            if not any(self.facts.within(scaler_call, node) for node in inside):
                raise refuse(scaler_call, f"`{code(scaler_call)}` outside the optimizer work is not migrated")

    def _check_other_methods(self, node: cst.ClassDef, scaler: str, wrapper: WrapperClass) -> None:
        for attribute in (a for a in self._self_attributes(node) if a.attr.value == scaler):
            if self.facts.within(attribute, wrapper.call) or any(
                self.facts.within(attribute, self.facts.statement_of(c)) for c in wrapper.constructors
            ):
                continue
            parent = self.facts.parent(attribute)
            if not (isinstance(parent, cst.Attribute) and parent.attr.value in SCALER_STATE_METHODS):
                raise Blocked(
                    attribute,
                    "RPM111",
                    f"loss-scaler wrapper {node.name.value}: `{code(parent or attribute)}` is not a use of the "
                    "scaler's state that the migration keeps; not migrated",
                )

    def _scaler_calls(self, root: cst.CSTNode, scaler: str) -> List[cst.Call]:
        pattern = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler))))
        return [c for c in self.facts.subtree(root, cst.Call) if m.matches(c, pattern)]

    def _self_attributes(self, root: cst.CSTNode) -> List[cst.Attribute]:
        """The ``self.<name>`` attributes at or under ``root``, in source order."""
        return [
            a
            for a in self.facts.subtree(root, cst.Attribute)
            if isinstance(a.value, cst.Name) and a.value.value == "self"
        ]

    def _bound(self, root: cst.CSTNode, outside: List[cst.BaseStatement] = ()) -> Set[str]:  # type: ignore[assignment]
        """Names assigned under ``root``, not counting those under the ``outside`` statements."""
        return {
            n.value
            for target in self.facts.subtree(root, _TARGETS)
            if not any(self.facts.within(target, s) for s in outside)
            for n in self.facts.subtree(target.target, cst.Name)  # type: ignore[attr-defined]
        }

    def _names_read_after(self, call: cst.FunctionDef, moved: List[cst.BaseStatement]) -> Set[str]:
        """Names the step's statements bind that ``__call__`` reads elsewhere (the norm)."""
        bound = {n for s in moved for n in self._bound(s)}
        read = set()
        for name in self.facts.subtree(call, cst.Name):
            if name.value in bound and not any(self.facts.within(name, s) for s in moved):
                read.add(name.value)
        return read

    # ------------------------------------------------------------ emit: the class
    def _plan_class(self, wrapper: WrapperClass) -> None:
        edits = self.plan.edits
        for constructor in wrapper.constructors:
            rewrite_constructor(self.rules, constructor, self.facts.scaler_kind(constructor))
        model = self.give_model(wrapper.node, wrapper.init)
        moved = list(wrapper.block.body)[wrapper.start : wrapper.update]
        self.plan.step_statements.update(n for s in moved for n in self.facts.subtree(s, cst.BaseStatement))
        step_fn = self.plan.fresh("_step_fn")
        waits = self.rules.exact or bool(wrapper.returned)
        returned = sorted(wrapper.returned)

        def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
            inside, update = updated[:-1], updated[-1]
            head = [cst.parse_statement(f"nonlocal {', '.join(returned)}\n")] if returned else []
            definition = cst.parse_statement(f"def {step_fn}():\n    pass\n")
            assert isinstance(definition, cst.FunctionDef)
            definition = definition.with_changes(
                leading_lines=leading_lines(inside[0]),
                body=definition.body.with_changes(body=[*head, inside[0].with_changes(leading_lines=()), *inside[1:]]),
            )
            unbound = sorted(wrapper.unbound)  # `nonlocal` needs a binding in __call__
            before = [cst.parse_statement(f"{name} = None\n") for name in unbound]
            step = cst.parse_statement(f"self.{model}.step({step_fn}{', is_async=False' if waits else ''})\n")
            return [*before, definition, step, update]

        edits.replace_range(wrapper.block, wrapper.start, wrapper.update + 1, build)
        self.plan.rewrites.append(
            (
                wrapper.node,
                f"loss-scaler wrapper {wrapper.node.name.value}: roundpipe.GradScaler, the model passed as model=; "
                f"autograd form: backward kept, optimizer work -> self.{model}.step({step_fn}"
                f"{', is_async=False' if waits else ''})"
                + (
                    f" (waited for: __call__ returns {', '.join(returned)})"
                    if wrapper.returned and not self.rules.exact
                    else ""
                ),
            )
        )

    def give_model(self, node: cst.ClassDef, init: cst.FunctionDef) -> str:
        """Plan ``__init__(..., *, model)`` storing the RoundPipe model on ``self``; return
        the attribute holding it (``_model``, or ``_roundpipe_model`` where the class uses
        that name already)."""
        taken = {a.attr.value for a in self._self_attributes(node)}
        model = "_model" if "_model" not in taken else "_roundpipe_model"

        def add_parameter(updated: cst.Parameters) -> cst.Parameters:
            star = updated.star_arg if isinstance(updated.star_arg, (cst.Param, cst.ParamStar)) else cst.ParamStar()
            return updated.with_changes(
                star_arg=star, kwonly_params=[*updated.kwonly_params, cst.Param(cst.Name("model"))]
            )

        self.plan.edits.replace_expression(init.params, add_parameter)
        first = 1 if is_docstring(list(init.body.body)[0]) else 0
        self.plan.edits.insert_before(init.body, first, [cst.parse_statement(f"self.{model} = model\n")])
        return model

    # ------------------------------------------------------------ emit: users
    def _plan_users(self, classes: Set[str]) -> Set[str]:
        """Plan every construction of the ``classes`` in this module and every call of the
        instances; return the classes built here."""
        built: Set[str] = set()
        instances: List[Tuple[Scope, str]] = []
        for call in self.facts.subtree(self.facts.module, cst.Call):
            built_class = self._built_class(call.func, classes)
            if built_class is not None:
                built.add(built_class)
                instances.append(self._plan_construction(call, None))
            elif self._may_be_library_wrapper(call) and self.facts.calls_any(call, set(LIBRARY_WRAPPERS)):
                library = LIBRARY_WRAPPERS[sorted(self.facts.qualified(call.func) & set(LIBRARY_WRAPPERS))[0]]
                instances.append(self._plan_construction(call, library))
        for function in self.facts.subtree(self.facts.module, cst.FunctionDef):
            for param in function.params.params:
                if (function.name.value, param.name.value) in self.context.instance_params:
                    scope = self.facts.scope(function.body.body[0]) if function.body.body else None
                    if scope is not None:
                        instances.append((scope, param.name.value))
        seen: Set[Tuple[int, str]] = set()
        while instances:
            scope, name = instances.pop()
            if (id(scope), name) in seen:
                continue
            seen.add((id(scope), name))
            for access in self.facts.accesses(name, scope):
                parent = self.facts.parent(access)
                if isinstance(parent, cst.Call) and parent.func is access:
                    self._plan_instance_call(parent)
                elif isinstance(parent, cst.Attribute) and parent.attr.value == "backward":
                    # `optimizer.backward(loss)` of an optimizer wrapper: the backward of its step
                    self.plan.backward_statements.add(self.facts.statement_of(parent))
                elif isinstance(parent, cst.Arg):
                    target = self.rules.parameter_fed_by(parent)
                    if target is not None:
                        instances.append(target)
        return built

    def _may_be_library_wrapper(self, call: cst.Call) -> bool:
        """A cheap test before the qualified name: ``x.NativeScaler(...)``, or a call of a
        name some import of the module binds to a ``NativeScaler``."""
        if self._library_names is None:
            self._library_names = {
                alias.evaluated_alias or alias.evaluated_name
                for line in self.facts.import_lines
                for statement in line.body
                if isinstance(statement, cst.ImportFrom) and not isinstance(statement.names, cst.ImportStar)
                for alias in statement.names
                if alias.evaluated_name == "NativeScaler"
            }
        func = call.func
        if isinstance(func, cst.Attribute):
            return func.attr.value == "NativeScaler"
        return isinstance(func, cst.Name) and func.value in self._library_names

    def _built_class(self, func: cst.BaseExpression, classes: Set[str]) -> Optional[str]:
        """The one of ``classes`` that calling ``func`` builds: ``C`` or ``module.C``
        (``import util.misc as misc``), its first name bound by a class definition or an
        import and not rebound; else None."""
        called = dotted(func)
        if called is None or called not in classes:
            return None
        first = func
        while isinstance(first, cst.Attribute):
            first = first.value
        return called if isinstance(first, cst.Name) and self._names_class(first) else None

    def _names_class(self, name: cst.Name) -> bool:
        """``name`` is bound (here) by a class definition or an import, not rebound."""
        scope = self.facts.scope(name)
        bindings = list(scope[name.value]) if scope is not None else []
        return bool(bindings) and all(
            isinstance(getattr(b, "node", None), (cst.ClassDef, cst.Import, cst.ImportFrom)) for b in bindings
        )

    def _plan_construction(self, call: cst.Call, library: Optional[str]) -> Tuple[Scope, str]:
        """``x = Wrapper(...)``: the model its optimizer trains is wrapped, and passed; a
        library's wrapper (``library``: its RoundPipe drop-in) is replaced by the drop-in,
        which waits for its steps (``is_async=False``) under ``--exact``."""
        statement = self.facts.statement_of(call)
        small = only_assignment(statement)
        if not (
            small is not None
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
            and (small.value is call or _optional(small.value, call))
        ):
            raise Blocked(
                call,
                "RPM111",
                f"loss-scaler wrapper {code(call.func)} is not assigned to a plain variable; not migrated",
            )
        scope = self.facts.scope(small)
        assert scope is not None
        name = small.targets[0].target.value
        if any(a.keyword is not None and a.keyword.value == "model" for a in call.args):
            return scope, name
        model = self._model_of_scope(call, scope)
        order_handed_optimizer_writes(self, call, model)
        added = [("model", model)] + ([("is_async", "False")] if library and self.rules.exact else [])

        def build(updated: cst.Call) -> cst.Call:
            updated = _with_keywords(updated, added)
            return updated.with_changes(func=cst.parse_expression(library)) if library else updated

        self.plan.edits.replace_expression(call, build)
        if library:
            self.rules.rewritten_constructors.add(call)  # its import goes when nothing else uses it
        replaced = f"-> {library}, " if library else ""
        self.plan.rewrites.append((call, f"loss-scaler wrapper {code(call.func)} {replaced}given the RoundPipe model"))
        return scope, name

    def _model_of_scope(self, call: cst.Call, scope: Scope) -> str:
        """The model whose optimizer is built in ``scope`` last before ``call`` (on
        ``model.parameters()``; a clipping's norm or a count of them is no optimizer); that
        optimizer is rebuilt on the RoundPipe copies."""
        candidates = []
        root = scope.node if isinstance(scope, LocalScope) else self.facts.module  # what defines the scope
        for assign in self.facts.subtree(root, cst.Assign):
            if self.facts.scope(assign) is not scope or self.facts.order(assign) > self.facts.order(call):
                continue
            if not isinstance(assign.value, cst.Call) or len(assign.targets) != 1 or never_an_optimizer(assign.value):
                continue
            owners = [c for c in self.facts.subtree(assign.value, cst.Call) if m.matches(c, PARAMETERS_CALL)]
            if owners:
                candidates.append((assign, owners))
        if not candidates:
            raise Blocked(
                call,
                "RPM111",
                f"loss-scaler wrapper {code(call.func)} is built where no optimizer is built on "
                "`model.parameters()`; the migrated wrapper needs that model; not migrated",
            )
        assign, owners = candidates[-1]
        models = {c.func.value.value for c in owners}  # type: ignore[attr-defined]
        if len(models) != 1:
            raise Blocked(
                assign, "RPM108", "the optimizer is not built on `model.parameters()` of one model; not migrated"
            )
        model = models.pop()
        statement = self.facts.statement_of(assign)
        assert isinstance(statement, cst.SimpleStatementLine)
        self._refuse_second_wrap(statement, scope, model)
        plan_model_wrap(self.rules, Binding(scope, model, statement, assign.value), model, owners)
        return model

    def _refuse_second_wrap(self, statement: cst.SimpleStatementLine, scope: Scope, model: str) -> None:
        """``statement`` would wrap ``model`` again: a wrap of it is planned earlier in
        ``scope`` (for another statement) and the name is not bound anew in between, so
        ``statement`` reads the RoundPipe model's parameters and may be no optimizer."""
        if id(statement) in self.plan.wrapped_optimizers:
            return
        at = self.facts.order(statement)
        earlier = [after for s, name, after in self.plan.wrapped_models if s is scope and name == model and after < at]
        if not earlier:
            return
        bindings = [self.facts.order(a.node) for a in scope.assignments[model] if isinstance(a, Assignment)]
        if any(max(earlier) < order < at for order in bindings):
            return
        raise Blocked(
            statement,
            "RPM111",
            f"`{code(statement).strip()}` reads the parameters of {model!r}, already wrapped with RoundPipe "
            "where its optimizer is built; a loss-scaler wrapper built after it cannot tell it for an "
            "optimizer; not migrated",
        )

    def _plan_instance_call(self, call: cst.Call) -> None:
        """``loss_scaler(loss, optimizer, ..., parameters=model.parameters())``: the
        parameters become the optimizer copies (``model.optim_parameters()``); in the
        asynchronous form, main-thread writes of the optimizer's state around the call wait
        for the step first; a plain ``loss.backward()`` path beside the call steps through
        RoundPipe too."""
        positional = [a for a in call.args if a.keyword is None]
        if len(positional) > 2 or any(a.star for a in call.args):
            raise Blocked(
                call,
                "RPM111",
                "the loss-scaler wrapper is called with more than (loss, optimizer) by position; "
                "pass the other arguments by keyword; not migrated",
            )
        model = self._parameters_on_copies(call)
        optimizer = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "optimizer"), None)
        optimizer = positional[1].value if len(positional) == 2 else optimizer
        if model is None or not isinstance(optimizer, cst.Name):
            return
        site = self._plan_plain_path(call, optimizer.value, model)
        root = self.facts.enclosing(site, (cst.FunctionDef,)) or self.facts.module
        # the wait for the wrapper's step comes right after the call (order_optimizer_writes)
        plan_model_zeroing(self.plan, self.facts, root, optimizer.value, model, {site}, False)
        if not self.rules.exact:
            self.order_optimizer_writes(site, optimizer.value, model)

    def _parameters_on_copies(self, call: cst.Call) -> Optional[str]:
        """Rewrite ``parameters=model.parameters()`` to ``model.optim_parameters()``; the
        model's name (None without a ``parameters`` argument)."""
        value = next((a.value for a in call.args if a.keyword is not None and a.keyword.value == "parameters"), None)
        if value is None:
            return None
        if m.matches(value, bare_method_call("optim_parameters")):
            return value.func.value.value  # type: ignore[attr-defined]
        if not m.matches(value, PARAMETERS_CALL):
            raise Blocked(
                value,
                "RPM111",
                f"the loss-scaler wrapper is given `parameters={code(value)}`; only `model.parameters()` "
                "of the RoundPipe model can be mapped to its optimizer copies; not migrated",
            )
        assert isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute)  # matched just above
        owner = cst.ensure_type(value.func.value, cst.Name)
        self.plan.edits.replace_expression(
            value.func,
            lambda updated: updated.with_changes(attr=cst.Name("optim_parameters")),
        )
        scope = self.facts.scope(owner)
        if scope is not None and any(
            isinstance(a, Assignment) and isinstance(a.node, cst.Param) for a in scope[owner.value]
        ):
            self.plan.wrapped_models.append((scope, owner.value, 0))
        self.plan.rewrites.append((call, "loss-scaler wrapper call: parameters -> model.optim_parameters()"))
        return owner.value

    def order_optimizer_writes(self, site: cst.BaseStatement, optimizer: str, model: str) -> None:
        """Writes of ``optimizer``'s state in the calling function (``zero_grad()``, lr
        loops, scheduler steps) would race with the wrapper's asynchronous step: the step is
        waited for right after the ``site`` (the call, or the two-path ``if`` holding it),
        when the backward is done, never between a forward and its backward."""
        root = self.facts.enclosing(site, (cst.FunctionDef,)) or self.facts.module
        skipped: Set[cst.CSTNode] = {site}
        if not optimizer_writes(self.facts, root, optimizer, self.is_scheduler, skipped, set()):
            return
        block = self.facts.parent(site)
        if not isinstance(block, (cst.IndentedBlock, cst.Module)):
            raise Blocked(site, "RPM111", "the loss-scaler wrapper call is not a statement of a block")
        index = list(block.body).index(site)
        self.plan.edits.insert_before(block, index + 1, [cst.parse_statement(f"{model}.synchronize()\n")])
        self.plan.rewrites.append(
            (
                site,
                f"{model}.synchronize() after the wrapper's step: the optimizer's state is written on the main thread",
            )
        )

    def is_scheduler(self, name: str, at: cst.CSTNode) -> bool:
        """:func:`~migrate.optimizer_writes.is_scheduler`; a name this file does not bind
        (a global of another module) is judged by its name."""
        return is_scheduler(self.rules, name, at, unbound=True)

    def _plan_plain_path(self, call: cst.Call, optimizer: str, model: str) -> cst.BaseStatement:
        """``if loss_scaler is not None: loss_scaler(...) else: loss.backward(); ...;
        optimizer.step()``: the plain branch takes the autograd form as well. Returns the
        statement that steps: the ``if``, or the call's own line."""
        statement = self.facts.statement_of(call)
        block = self.facts.parent(statement)
        assert block is not None  # a statement's block
        step = _WrapperStep(self.rules, self.facts, block, code(call.func), (optimizer, model), None, model)
        if not plan_plain_path(step, _PLAIN_BACKWARD, _PlainPathBesideWrapper):  # type: ignore[arg-type]
            return statement
        owner = self.facts.parent(block)
        return self.facts.parent(owner) if isinstance(owner, cst.Else) else owner  # type: ignore[return-value]


@dataclass(frozen=True)
class _WrapperStep:
    """A wrapper call seen as the AMP step of a two-path step: what the plain path's rule
    reads of the step beside it."""

    rules: "TorchAmpRules"
    facts: object
    block: cst.CSTNode
    scaler: str
    trained: Tuple[str, str]  # (optimizer, model)
    built: Optional[Binding]
    model_outer: str
    split = None  # a wrapper call is never one branch of a two-path split (migrate.two_path)


#: ``loss.backward()``, possibly with ``create_graph=<name>`` (kept as written, as the
#: wrapper keeps it).
_PLAIN_BACKWARD = m.Call(
    func=m.Attribute(value=m.Name(), attr=m.Name("backward")),
    args=m.OneOf([], [m.Arg(keyword=m.Name("create_graph"), value=m.Name())]),
)


class _PlainPathBesideWrapper(PlainStepBuilder):
    """The plain path of a two-path step whose AMP path is a wrapper call; the wrapper rule
    orders the main-thread optimizer writes for both paths (after the whole ``if``)."""

    orders_optimizer_writes = False


def _first_statement(function: cst.FunctionDef) -> Optional[cst.CSTNode]:
    body = list(function.body.body)
    if body and is_docstring(body[0]):
        body = body[1:]
    return body[0] if body else None


def _returns_only(statement: cst.BaseStatement) -> bool:
    """``if <test>: return ...`` without else: an early return before the optimizer work."""
    return (
        isinstance(statement, cst.If)
        and statement.orelse is None
        and all(
            isinstance(s, cst.SimpleStatementLine) and all(isinstance(small, cst.Return) for small in s.body)
            for s in statement.body.body
        )
    )


def _is_scaler_call(node: Optional[cst.CSTNode], scaler: str, method: str, optimizer: str) -> bool:
    return node is not None and m.matches(
        node,
        m.Call(
            func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler)), attr=m.Name(method)),
            args=[m.Arg(value=m.Name(optimizer), keyword=None)],
        ),
    )


def _optional(value: cst.BaseExpression, call: cst.Call) -> bool:
    return isinstance(value, cst.IfExp) and (value.body is call or value.orelse is call)


def _with_keywords(call: cst.Call, keywords: List[Tuple[str, str]]) -> cst.Call:
    """``call`` with ``name=value`` arguments appended."""
    args = list(call.args)
    for name, value in keywords:
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        equal = cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))
        args.append(cst.Arg(cst.parse_expression(value), keyword=cst.Name(name), equal=equal))
    return call.with_changes(args=args)
