"""AMP helper classes with separate methods (issue 10, shape 2: the wrapper shape that has no
``__call__``), recognised as a whole and migrated with every place that builds or calls them.

The shape (Swin-style utilities, trainer-local ``AmpHelper``/``MixedPrecision`` classes): a
class whose ``__init__`` stores one torch GradScaler on ``self``, built inline or handed in
(``self.scaler = scaler or GradScaler(...)``, also ``scaler if scaler is not None else ...``),
behind methods that each do one thing with it::

    def scale_loss(self, loss): return self.scaler.scale(loss)       # caller: .backward()
    def backward(self, loss): self.scaler.scale(loss).backward()
    def unscale(self, optimizer): self.scaler.unscale_(optimizer)
    def optimizer_step(self, optimizer):
        self.scaler.step(optimizer)
        self.scaler.update()                                          # optional
    def update(self): self.scaler.update()
    def state_dict(self): return self.scaler.state_dict()            # the scaler's state methods

Each method is migrated by its role, so the interface and the order of the caller's calls stay:

* scale and backward methods stay on the caller's thread as written (RoundPipe's autograd form:
  the backward accumulates the model's gradients), and so do update and state methods;
* an *unscale* method runs ``unscale_`` in a step function of ``self._model.step``, which hands
  the accumulated gradients to the optimizer copies; it is always waited for
  (``is_async=False``), since its callers read the unscaled gradients on the main thread
  (clipping) before the step method runs;
* a *step* method runs ``self.scaler.step(optimizer)`` in a step function (waited for under
  ``--exact``), its trailing ``update()`` after it on the caller's thread; a step after an
  unscale hands over nothing new (no backward came between), so the copies keep the
  gradients the caller clipped. A step method may also take clipping arguments
  (``step(self, optimizer, clip_grad=None, parameters=None)``: ``unscale_`` and clipping under
  ``if``s, then ``step``): its whole body but the update runs in the step function, and the
  caller's ``parameters=model.parameters()`` becomes ``model.optim_parameters()``.

In the callers, between ``helper.unscale(opt)`` and the ``helper.<step>(opt)`` that follows it
(in the same block, or after the ``if`` holding the unscale), clipping of ``model.parameters()``
is clipping of the copies (``model.optim_parameters()``); anything else reading the model's parameters or gradients
there is refused. After the step call, the caller's ``opt.zero_grad()`` also clears the
model's gradients, and in the asynchronous form its main-thread writes of the optimizer's state
wait for the step (:meth:`migrate.scaler_wrapper.ScalerWrappers.order_optimizer_writes`). A
GradScaler built in the construction's argument for the scaler (``Helper(scaler=GradScaler())``)
is rewritten with the class's own (``roundpipe.GradScaler``); the construction gets
``model=model`` as every wrapper's does. Callers in other files learn the roles from
:func:`amp_helper_roles` (through :class:`~migrate.scaler_wrapper.WrapperContext`).

A method doing anything else (logging is kept only in methods that stay on the caller's thread,
and only when it reads nothing but its arguments and the scale), two scalers in one class, a
base class, an instance used other than through its methods, a scaler built elsewhere handed
to the construction: refused (RPM111), naming the method or the use. Pure source analysis: never imports torch.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Set, Tuple, Union, cast

import libcst as cst
import libcst.matchers as m

from .gradient_reads import check_gradient_reads_after_call
from .names import SCALER_STATE_METHODS
from .optimizer_wrapper_class import OPTIMIZER_INTERFACE, GradientMethod, plan_gradient_method
from .optimizer_writes import optimizer_writes
from .plan import Blocked
from .rules.model_zero_grad import plan_model_zeroing
from .rules.scaler_constructor import rewrite_constructor
from .syntax import PARAMETERS_CALL, code, is_docstring, only_assignment, only_expression, statements_of

if TYPE_CHECKING:
    from libcst.metadata import Scope

    from .scaler_wrapper import ScalerWrappers

__all__ = ["AmpHelperClass", "recognise_amp_helper", "plan_amp_helper", "plan_helper_users", "amp_helper_roles"]

#: clipping functions whose first argument (or ``parameters=``) is the parameters clipped
_CLIPPING = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"})
#: builtins that reduce what they are given to a number
_REDUCTIONS = frozenset({"sum", "len", "max", "min", "any", "all"})

#: logger methods a kept logging statement may call
_LOG_LEVELS = frozenset({"debug", "info", "warning", "warn", "error"})


@dataclass
class AmpHelperClass:
    """A recognised AMP helper: ``scaler`` is the attribute holding its GradScaler,
    ``roles`` maps each method's name to its role (see the module docstring: ``scale``,
    ``backward``, ``unscale``, ``step``, ``update``, ``state``, ``plain``)."""

    node: cst.ClassDef
    scaler: str
    constructors: Tuple[cst.Call, ...]
    init: cst.FunctionDef
    roles: Dict[str, str]


def amp_helper_roles(node: ast.ClassDef) -> Optional[Dict[str, str]]:
    """The caller-visible roles of the methods of ``node`` (a class of another file, as
    :mod:`ast` parses it) when it looks like an AMP helper: no ``__call__``, not an optimizer
    wrapper's interface, a method stepping through ``self.<x>.step(...)``; ``"__init__"``
    maps to :func:`_injection`'s text when the scaler can be handed in. The class's own
    file is migrated (or refused) by :func:`recognise_amp_helper`; this only tells callers
    which method does what."""
    methods = [n for n in node.body if isinstance(n, ast.FunctionDef)]
    names = {n.name for n in methods}
    if "__call__" in names or OPTIMIZER_INTERFACE <= names or not any(_ast_steps_its_argument(f) for f in methods):
        return None
    roles: Dict[str, str] = {}
    for method in methods:
        called = {
            c.func.attr
            for c in ast.walk(method)
            if isinstance(c, ast.Call)
            and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Attribute)
            and isinstance(c.func.value.value, ast.Name)
            and c.func.value.value.id == "self"
        }
        if method.name == "__init__":
            injected = _ast_injected(method)
            if injected is not None:
                roles["__init__"] = injected
        elif "step" in called:
            roles[method.name] = "step"
        elif "unscale_" in called:
            roles[method.name] = "unscale"
        elif "scale" in called:
            backward = any(isinstance(c, ast.Attribute) and c.attr == "backward" for c in ast.walk(method))
            roles[method.name] = "backward" if backward else "scale"
    return roles


def _ast_injected(init: ast.FunctionDef) -> Optional[str]:
    """:func:`_injection` of ``__init__`` as :mod:`ast` parses it."""
    params = [a.arg for a in init.args.args][1:]
    for node in ast.walk(init):
        value = node.value if isinstance(node, ast.Assign) else None
        tested = None
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or) and isinstance(value.values[0], ast.Name):
            tested = value.values[0].id
        elif isinstance(value, ast.IfExp) and isinstance(value.test, ast.Compare):
            left = value.test.left
            tested = left.id if isinstance(left, ast.Name) else None
        if tested in params:
            return f"scaler {tested} {params.index(tested)}"
    return None


def _ast_steps_its_argument(method: ast.FunctionDef) -> bool:
    """:func:`_steps_its_argument` of a method as :mod:`ast` parses it (any scaler attribute)."""
    params = [a.arg for a in method.args.args]
    steps = len(params) >= 2 and any(
        isinstance(c, ast.Call)
        and isinstance(c.func, ast.Attribute)
        and c.func.attr == "step"
        and isinstance(c.func.value, ast.Attribute)
        and isinstance(c.func.value.value, ast.Name)
        and c.func.value.value.id == "self"
        and [ast.unparse(a) for a in c.args] == [params[1]]
        for c in ast.walk(method)
    )
    scales = any(isinstance(a, ast.Attribute) and a.attr in ("backward", "scale") for a in ast.walk(method))
    return steps and (len(params) == 2 or not scales)


# ---------------------------------------------------------------------- recognition
def recognise_amp_helper(wrappers: "ScalerWrappers", node: cst.ClassDef) -> Optional[AmpHelperClass]:
    """The AMP helper in ``node``; None when it is none (a ``__call__`` class, or no torch
    GradScaler stored on ``self``) or one already in RoundPipe form (its backwards are then
    claimed). Blocked (RPM111) for a class of this kind that the migration does not handle;
    its scalers and backwards are claimed first, so that nothing else reports them."""
    methods = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
    if "__call__" in methods or not any(len(f.params.params) >= 2 for f in methods.values()):
        return None  # no method that could step an optimizer it is given
    stored = _stored_scalers(wrappers, node)
    if not stored or not any(_steps_its_argument(f, a) for f in methods.values() for a, _ in stored):
        return None
    for call in wrappers.facts.backward_calls:
        if wrappers.facts.within(call, node):
            wrappers.plan.backward_statements.add(wrappers.facts.statement_of(call))
    if any("roundpipe.GradScaler" in wrappers.facts.qualified(c.func) for _, c in stored):
        return None
    wrappers.claimed.update(c for _, c in stored)
    return _Recogniser(wrappers, node, methods, stored).run()


def _steps_its_argument(method: cst.FunctionDef, scaler: str) -> bool:
    """``method(self, optimizer, ...)`` calls ``self.<scaler>.step(optimizer)``, and with more
    parameters than the optimizer neither scales nor backpropagates: what makes a class
    holding a scaler an AMP helper rather than a trainer stepping its own optimizer (or one
    handed to a training method with the batch)."""
    params = [p.name.value for p in method.params.params]
    if len(params) < 2 or not m.findall(method, _scaler_call(scaler, "step", params[1])):
        return False
    return len(params) == 2 or not m.findall(method, m.Attribute(attr=m.Name("backward") | m.Name("scale")))


def _stored_scalers(wrappers: "ScalerWrappers", node: cst.ClassDef) -> List[Tuple[str, cst.Call]]:
    """``(attribute, GradScaler call)`` for each ``self.<attribute> = <value>`` in the class
    whose value is a GradScaler call (torch's or RoundPipe's), or a handed-in scaler with one
    as its fallback (``scaler or GradScaler()``, ``scaler if scaler is not None else ...``)."""
    found = []
    for assign in wrappers.facts.subtree(node, cst.Assign):
        if len(assign.targets) != 1 or not m.matches(
            assign.targets[0].target, m.Attribute(value=m.Name("self"), attr=m.Name())
        ):
            continue
        call = _fallback_call(assign.value)
        if call is not None and (
            _is_torch_scaler(wrappers, call) or "roundpipe.GradScaler" in wrappers.facts.qualified(call.func)
        ):
            found.append((cst.ensure_type(assign.targets[0].target, cst.Attribute).attr.value, call))
    return found


def _fallback_call(value: cst.BaseExpression) -> Optional[cst.Call]:
    """The call ``value`` builds: ``value`` itself, or the fallback of ``<name> or <call>`` /
    ``<name> if <name> is not None else <call>`` / ``<call> if <name> is None else <name>``."""
    if isinstance(value, cst.Call):
        return value
    if isinstance(value, cst.BooleanOperation) and isinstance(value.operator, cst.Or):
        if isinstance(value.left, cst.Name) and isinstance(value.right, cst.Call):
            return value.right
    if isinstance(value, cst.IfExp) and isinstance(value.test, cst.Comparison):
        test = value.test
        tested = test.left if isinstance(test.left, cst.Name) and len(test.comparisons) == 1 else None
        if tested is None or not m.matches(test.comparisons[0].comparator, m.Name("None")):
            return None
        operator = test.comparisons[0].operator
        kept, built = (value.body, value.orelse) if isinstance(operator, cst.IsNot) else (value.orelse, value.body)
        if isinstance(operator, (cst.Is, cst.IsNot)) and m.matches(kept, m.Name(tested.value)):
            return built if isinstance(built, cst.Call) else None
    return None


def _injection(init: cst.FunctionDef, built: cst.Call) -> Optional[str]:
    """``"scaler <parameter> <position>"`` when ``__init__`` stores a handed-in scaler with
    ``built`` as its fallback (``self.scaler = scaler or GradScaler()``): the parameter and
    its position after ``self``, where a construction may hand a GradScaler in."""
    params = [p.name.value for p in init.params.params][1:]
    for assign in m.findall(init, m.Assign()):
        value = cst.ensure_type(assign, cst.Assign).value
        if _fallback_call(value) is not built or value is built:
            continue
        tested = value.left if isinstance(value, cst.BooleanOperation) else cst.ensure_type(value, cst.IfExp).test
        name = tested.left if isinstance(tested, cst.Comparison) else tested
        if isinstance(name, cst.Name) and name.value in params:
            return f"scaler {name.value} {params.index(name.value)}"
    return None


def _is_torch_scaler(wrappers: "ScalerWrappers", call: cst.Call) -> bool:
    try:
        return wrappers.facts.scaler_kind(call) is not None
    except ValueError:  # a spelling the scaler rules report themselves
        return False


class _Recogniser:
    """Gives each method of one candidate class its role (see the module docstring)."""

    def __init__(
        self,
        wrappers: "ScalerWrappers",
        node: cst.ClassDef,
        methods: Dict[str, cst.FunctionDef],
        stored: List[Tuple[str, cst.Call]],
    ) -> None:
        self.facts = wrappers.facts
        self.node = node
        self.methods = methods
        self.stored = stored

    def refuse(self, at: cst.CSTNode, why: str) -> Blocked:
        return Blocked(at, "RPM111", f"AMP helper {self.node.name.value}: {why}; not migrated (migrate it by hand)")

    def run(self) -> AmpHelperClass:
        if any(not m.matches(b.value, m.Name("object")) for b in self.node.bases):
            raise self.refuse(self.node, "it inherits from another class, whose methods the migration does not see")
        attributes = sorted({a for a, _ in self.stored})
        if len(attributes) != 1:
            raise self.refuse(self.stored[1][1], f"it holds two scalers ({', '.join(attributes)})")
        scaler = attributes[0]
        init = self.methods.get("__init__")
        if init is None or len(self.stored) != 1 or not self.facts.within(self.stored[0][1], init):
            raise self.refuse(self.stored[0][1], f"its GradScaler must be stored once, in __init__, as self.{scaler}")
        settings = self._settings(init)
        store = self.facts.enclosing(self.stored[0][1], (cst.Assign,))
        for use in _scaler_attributes(init, scaler):
            if store is None or use is not store.targets[0].target:
                raise self.refuse(use, f"__init__ uses self.{scaler} beyond storing it")
        roles = {
            name: self._role(method, scaler, settings) for name, method in self.methods.items() if method is not init
        }
        injected = _injection(init, self.stored[0][1])
        roles.update({"__init__": injected} if injected is not None else {})
        return AmpHelperClass(self.node, scaler, (self.stored[0][1],), init, roles)

    def _settings(self, init: cst.FunctionDef) -> Set[str]:
        """Attributes of ``self`` that ``__init__`` assigns and no other method does."""
        assigned: Dict[str, bool] = {}
        for target in m.findall(self.node, m.AssignTarget() | m.AugAssign() | m.AnnAssign()):
            for held in m.findall(target.target, m.Attribute(value=m.Name("self"), attr=m.Name())):  # type: ignore[attr-defined]
                name = cst.ensure_type(held, cst.Attribute).attr.value
                assigned[name] = assigned.get(name, True) and self.facts.within(target, init)
        return {name for name, only_init in assigned.items() if only_init}

    def _role(self, method: cst.FunctionDef, scaler: str, settings: Set[str]) -> str:
        """The role of ``method``; Blocked when it does anything beyond the roles' scaler calls."""
        name = method.name.value
        params = [p.name.value for p in method.params.params]
        if not isinstance(method.body, cst.IndentedBlock):
            raise self.refuse(method, f"{name}() must have its body on lines of its own")
        body = [s for s in statements_of(method.body) if not is_docstring(s)]
        kept = [s for s in body if not self._harmless_log(s, scaler, settings)]
        argument = params[1] if len(params) == 2 and params[0] == "self" else None
        own = self._self_uses_only_scaler(method, scaler, settings)
        if argument is not None and own and not method.decorators:
            if body == kept and _matches_each(body, [_scaler_call(scaler, "unscale_", argument)]):
                return "unscale"
            step = _scaler_call(scaler, "step", argument)
            if body == kept and (
                _matches_each(body, [step]) or _matches_each(body, [step, _scaler_call(scaler, "update", None)])
            ):
                return "step"
            if _matches_each(kept, [m.Return(value=_scaler_call(scaler, "scale", argument))]):
                return "scale"
            backward = m.Call(
                func=m.Attribute(value=_scaler_call(scaler, "scale", argument), attr=m.Name("backward")),
                args=m.OneOf([], [m.Arg(keyword=m.Name("retain_graph"))]),
            )
            if _matches_each(kept, [backward]):
                return "backward"
        if own and params == ["self"] and _matches_each(kept, [_scaler_call(scaler, "update", None)]):
            return "update"
        if (
            own
            and body == kept
            and not method.decorators
            and len(params) > 2
            and self._clipping_step(method, body, scaler)
        ):
            return "step"
        uses = _scaler_attributes(method, scaler)
        if own and not self._touches_gradients(method) and all(self._state_call(u) for u in uses):
            return "state" if uses else "plain"
        extra = next((s for s in body if not _is_scaler_line(s, scaler)), None)
        what = (
            f"`{code(extra).strip()}` beside its scaler calls"
            if extra is not None
            else "an unsupported mix of scaler calls"
        )
        if extra is not None and self._harmless_log(extra, scaler, settings):
            what = f"`{code(extra).strip()}`, a log that would run on the optimizer thread"
        raise self.refuse(
            extra or method,
            f"{name}() does {what} (a method may do one role: scale/backward, unscale_, step and update, "
            "the scaler's state)",
        )

    def _clipping_step(self, method: cst.FunctionDef, body: List[cst.BaseStatement], scaler: str) -> bool:
        """``step(self, optimizer, clip_grad=None, parameters=None)``: ``self.<scaler>.step(optimizer)``
        once at the top level, before it (perhaps under ``if``s on the parameters) only
        ``unscale_`` of the optimizer, clipping and assertions, perhaps a trailing ``update()``;
        no returns. The whole body but the update runs in the step function."""
        optimizer = method.params.params[1].name.value
        update = _scaler_call(scaler, "update", None)
        moved = body[:-1] if body and _matches_each(body[-1:], [update]) else body
        step = _scaler_call(scaler, "step", optimizer)
        if sum(_matches_each([s], [step]) for s in moved) != 1 or not _matches_each(moved[-1:], [step]):
            return False
        allowed = step | _scaler_call(scaler, "unscale_", optimizer)
        for statement in moved:
            if m.findall(statement, m.Return() | m.Yield() | m.Nonlocal() | m.Global() | m.Await() | m.Lambda()):
                return False
            for call in self.facts.subtree(statement, cst.Call):
                if not (m.matches(call, allowed) or _clipping_name(call) in _CLIPPING):
                    return False
            if not all(isinstance(s, cst.If) for s in self.facts.subtree(statement, cst.BaseCompoundStatement)):
                return False
        return True

    def _self_uses_only_scaler(self, method: cst.FunctionDef, scaler: str, settings: Set[str]) -> bool:
        """Every ``self`` in ``method`` is ``self.<scaler>.<call>`` or a read of a setting."""
        for reference in (n for n in self.facts.subtree(method, cst.Name) if n.value == "self"):
            parent = self.facts.parent(reference)
            if isinstance(parent, cst.Param):
                continue
            if not isinstance(parent, cst.Attribute) or parent.value is not reference:
                return False
            if parent.attr.value == scaler:
                owner = self.facts.parent(parent)
                if not (isinstance(owner, cst.Attribute) and isinstance(self.facts.parent(owner), cst.Call)):
                    return False
            elif parent.attr.value not in settings or isinstance(self.facts.parent(parent), cst.Call):
                return False
        return True

    def _state_call(self, use: cst.Attribute) -> bool:
        parent = self.facts.parent(use)
        return isinstance(parent, cst.Attribute) and parent.attr.value in SCALER_STATE_METHODS

    def _touches_gradients(self, method: cst.FunctionDef) -> bool:
        return any(
            a.attr.value == "grad" or a.attr.value in _CLIPPING for a in self.facts.subtree(method, cst.Attribute)
        ) or any(n.value in _CLIPPING for n in self.facts.subtree(method, cst.Name))

    def _harmless_log(self, statement: cst.BaseStatement, scaler: str, settings: Set[str]) -> bool:
        """``print(...)`` or ``<logger>.info(...)`` (any level of :data:`_LOG_LEVELS`) whose
        arguments call nothing but ``self.<scaler>.get_scale()``/``is_enabled()``: it reads
        its arguments and the scale, writes only the log, and stays where it is."""
        value = only_expression(statement)
        if not isinstance(value, cst.Call):
            return False
        log = m.Name("print") | m.Attribute(value=m.Name() | m.Attribute(value=m.Name("self")), attr=m.Name())
        if not m.matches(value.func, log):
            return False
        if isinstance(value.func, cst.Attribute) and value.func.attr.value not in _LOG_LEVELS:
            return False
        reads = _scaler_call(scaler, "get_scale", None) | _scaler_call(scaler, "is_enabled", None)
        for arg in value.args:
            if any(not m.matches(c, reads) for c in self.facts.subtree(arg, cst.Call)):
                return False
        return True


# ---------------------------------------------------------------------- emit: the class
def plan_amp_helper(wrappers: "ScalerWrappers", helper: AmpHelperClass) -> None:
    """Plan the class's rewrite (see the module docstring)."""
    rules, plan = wrappers.rules, wrappers.plan
    for constructor in helper.constructors:
        rewrite_constructor(rules, constructor, wrappers.facts.scaler_kind(constructor))
    model = wrappers.give_model(helper.node, helper.init)
    steps = []
    methods = {s.name.value: s for s in helper.node.body.body if isinstance(s, cst.FunctionDef)}
    for name, role in helper.roles.items():
        if role not in ("unscale", "step"):
            continue
        step_fn = plan.fresh("_step_fn")
        waits = rules.exact or role == "unscale"
        plan_gradient_method(wrappers, _gradient_method(methods[name], helper.scaler), model, step_fn, waits)
        steps.append(f"{name}() -> self.{model}.step({step_fn}{', is_async=False' if waits else ''})")
    plan.rewrites.append(
        (
            helper.node,
            f"AMP helper {helper.node.name.value}: roundpipe.GradScaler, the model passed as model=; autograd form: "
            f"scale and backward kept, {'; '.join(steps)} (unscale waited for: callers clip the unscaled gradients)",
        )
    )


def _gradient_method(method: cst.FunctionDef, scaler: str) -> GradientMethod:
    """The unscale or step ``method`` as a body that becomes a step function (a trailing
    ``update()`` stays after it; the parameters the body rebinds are its ``nonlocal`` names)."""
    body = statements_of(method.body)
    first = 1 if is_docstring(body[0]) else 0
    updates = _matches_each(body[-1:], [_scaler_call(scaler, "update", None)])
    params = {p.name.value for p in method.params.params}
    rebound = {
        cst.ensure_type(n, cst.Name).value
        for target in m.findall(method, m.AssignTarget() | m.AugAssign() | m.AnnAssign())
        for n in m.findall(target.target, m.Name())  # type: ignore[attr-defined]
    }
    return GradientMethod(method, first, updates, None, sorted(params & rebound))


# ---------------------------------------------------------------------- emit: users
def plan_helper_users(wrappers: "ScalerWrappers", helpers: Mapping[str, Mapping[str, str]]) -> None:
    """Plan the constructions of the ``helpers`` (class name in this file -> method roles) and
    every method call of their instances (built here, or fed here by another file)."""
    facts = wrappers.facts
    instances: List[Tuple["Scope", str, Mapping[str, str]]] = []
    for call in facts.subtree(facts.module, cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value in helpers:
            _plan_handed_scalers(wrappers, call, helpers[call.func.value].get("__init__"))
            small = only_assignment(facts.statement_of(call))
            scope = facts.scope(call)
            if small is not None and small.value is call and isinstance(small.targets[0].target, cst.Name) and scope:
                instances.append((scope, small.targets[0].target.value, helpers[call.func.value]))
    fed: Dict[Tuple[str, str], Dict[str, str]] = {}
    for function_name, param_name, method, role in wrappers.context.helper_params:
        fed.setdefault((function_name, param_name), {})[method] = role
    for function in facts.subtree(facts.module, cst.FunctionDef):
        for param in function.params.params:
            param_roles = fed.get((function.name.value, param.name.value))
            scope = facts.scope(function.body.body[0]) if param_roles and function.body.body else None
            if param_roles and scope is not None:
                instances.append((scope, param.name.value, param_roles))
    calls: List[Tuple[cst.Call, str, Mapping[str, str]]] = []  # method call, instance, roles
    seen: Set[Tuple[int, str]] = set()
    while instances:
        scope, name, roles = instances.pop()
        if (id(scope), name) in seen:
            continue
        seen.add((id(scope), name))
        for access in facts.accesses(name, scope):
            parent = facts.parent(access)
            if isinstance(parent, cst.Arg):
                target = wrappers.rules.parameter_fed_by(parent)
                if target is not None:
                    instances.append((*target, roles))
                continue
            called = facts.parent(parent)
            if not (
                isinstance(parent, cst.Attribute)
                and parent.value is access
                and isinstance(called, cst.Call)
                and called.func is parent
            ):
                raise Blocked(
                    parent or access,
                    "RPM111",
                    f"`{code(parent or access)}` uses the AMP helper other than by calling its methods; not migrated",
                )
            calls.append((called, name, roles))
    for call, name, roles in sorted(calls, key=lambda c: facts.order(c[0])):
        method = cst.ensure_type(call.func, cst.Attribute).attr.value
        _plan_method_call(wrappers, call, name, roles.get(method), roles)


def _plan_handed_scalers(wrappers: "ScalerWrappers", construction: cst.Call, injection: Optional[str]) -> None:
    """The GradScaler handed to the construction (``Helper(scaler=GradScaler())``; ``injection``:
    the helper's :func:`_injection`) becomes RoundPipe's, like the class's own; ``None`` or
    nothing keeps the class's own; a scaler built elsewhere is not followed (RPM111)."""
    if injection is None:
        return
    _, name, position = injection.split()
    positional = [a for a in construction.args if a.keyword is None]
    handed = next((a.value for a in construction.args if a.keyword is not None and a.keyword.value == name), None)
    handed = positional[int(position)].value if int(position) < len(positional) else handed
    if handed is None or m.matches(handed, m.Name("None")):
        return
    if isinstance(handed, cst.Call) and _is_torch_scaler(wrappers, handed):
        wrappers.claimed.add(handed)
        rewrite_constructor(wrappers.rules, handed, wrappers.facts.scaler_kind(handed))
        return
    if not (isinstance(handed, cst.Call) and "roundpipe.GradScaler" in wrappers.facts.qualified(handed.func)):
        raise Blocked(
            handed,
            "RPM111",
            f"the AMP helper is handed `{code(handed)}` as its scaler; only a GradScaler built in the call "
            "(`scaler=GradScaler(...)`) is migrated with it; not migrated",
        )


def _plan_method_call(
    wrappers: "ScalerWrappers", call: cst.Call, instance: str, role: Optional[str], roles: Mapping[str, str]
) -> None:
    facts, plan = wrappers.facts, wrappers.plan
    statement = facts.statement_of(call)
    if role in ("scale", "backward"):
        backward = facts.parent(facts.parent(call)) if role == "scale" else call
        if isinstance(backward, cst.Call) and only_expression(statement) is backward:
            plan.backward_statements.add(statement)
        return
    if role not in ("unscale", "step"):
        return
    optimizer = call.args[0].value if call.args and call.args[0].keyword is None else None
    block = facts.parent(statement)
    if (
        not isinstance(optimizer, cst.Name)
        or only_expression(statement) is not call
        or not isinstance(block, (cst.IndentedBlock, cst.Module))
    ):
        raise Blocked(
            call,
            "RPM111",
            f"`{code(call)}` must be a statement of its own, given the optimizer by name; not migrated",
        )
    if role == "unscale" and len(call.args) > 1 or any(a.star for a in call.args):
        raise Blocked(call, "RPM111", f"`{code(call)}` is given more than the optimizer by name; not migrated")
    if role == "unscale":
        _plan_clipping_between(wrappers, block, statement, instance, optimizer.value, roles)
        return
    model = _parameters_on_copies(wrappers, call) or _stepped_model(wrappers, block, statement, optimizer.value)
    root = facts.enclosing(statement, (cst.FunctionDef,)) or facts.module
    plan_model_zeroing(plan, facts, root, optimizer.value, model, {statement}, False)
    check_gradient_reads_after_call(facts, plan, call)
    if wrappers.rules.exact:
        return
    if model is not None:
        wrappers.order_optimizer_writes(statement, optimizer.value, model)
    elif optimizer_writes(facts, root, optimizer.value, wrappers.is_scheduler, {statement}, set()):
        raise Blocked(
            call,
            "RPM111",
            f"`{code(call)}` steps asynchronously, and the model whose step must be waited for before the "
            f"writes of {optimizer.value}'s state here has no name in this function; not migrated",
        )


def _parameters_on_copies(wrappers: "ScalerWrappers", call: cst.Call) -> Optional[str]:
    """The step call's other arguments (a step method that clips): ``model.parameters()``
    becomes the copies (``model.optim_parameters()``), and names the model; any other read
    of a model's parameters there is refused."""
    model = None
    for arg in call.args[1:]:
        if m.matches(arg.value, PARAMETERS_CALL):
            parameters = cst.ensure_type(arg.value, cst.Call)
            _clip_copies(wrappers, parameters)
            model = cst.ensure_type(cst.ensure_type(parameters.func, cst.Attribute).value, cst.Name).value
        elif m.findall(arg.value, m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters") | m.Name("grad"))):
            raise Blocked(
                arg.value,
                "RPM111",
                f"the AMP helper's step is given `{code(arg.value)}`; only `model.parameters()` of the RoundPipe "
                "model can be mapped to its optimizer copies; not migrated",
            )
    return model


def _plan_clipping_between(
    wrappers: "ScalerWrappers",
    block: Union[cst.IndentedBlock, cst.Module],
    unscale: cst.BaseStatement,
    instance: str,
    optimizer: str,
    roles: Mapping[str, str],
) -> None:
    """``helper.unscale(opt)`` ... ``helper.<step>(opt)``: between them, clipping of
    ``model.parameters()`` clips the optimizer copies, which hold the unscaled gradients. The
    step follows the unscale in its block, or in a block around the ``if`` holding it (an
    unscale and clipping under a clipping flag, the step after them)."""
    facts, plan = wrappers.facts, wrappers.plan
    between: List[cst.BaseStatement] = []
    current: cst.BaseStatement = unscale
    step = None
    while step is None:
        body = list(block.body)
        index = body.index(current)
        step = next((i for i in range(index + 1, len(body)) if _is_step_of(body[i], instance, optimizer, roles)), None)
        between += body[index + 1 : step]
        owner = facts.parent(block)
        owner = facts.parent(owner) if isinstance(owner, cst.Else) else owner
        outer = facts.parent(owner) if isinstance(owner, cst.If) else None
        if step is None and not isinstance(outer, (cst.IndentedBlock, cst.Module)):
            raise Blocked(
                unscale,
                "RPM111",
                f"`{code(unscale).strip()}` is not followed by the helper's step of {optimizer} in its block "
                "or in one around its `if`; not migrated",
            )
        if step is None:
            current, block = cast(cst.If, owner), cast(Union[cst.IndentedBlock, cst.Module], outer)
    for statement in between:
        clipped = set()
        for call in facts.subtree(statement, cst.Call):
            if _clipping_name(call) in _CLIPPING and call.args and m.matches(call.args[0].value, PARAMETERS_CALL):
                clipped.add(call.args[0].value)
        for read in facts.subtree(statement, cst.Call):
            if m.matches(read, PARAMETERS_CALL | m.Call(func=m.Attribute(attr=m.Name("named_parameters")))):
                if read not in clipped:
                    raise Blocked(
                        read,
                        "RPM111",
                        f"`{code(read)}` between the helper's unscale and step is not clipping; the unscaled "
                        "gradients live on the optimizer copies there; not migrated",
                    )
        for attribute in facts.subtree(statement, cst.Attribute):
            if attribute.attr.value == "grad":
                raise Blocked(
                    attribute,
                    "RPM111",
                    f"`{code(attribute)}` between the helper's unscale and step reads the model's gradients, "
                    "which live on the optimizer copies there; not migrated",
                )
        for parameters in clipped:
            _clip_copies(wrappers, cst.ensure_type(parameters, cst.Call))
    plan.rewrites.append((unscale, "AMP helper unscale: clipping until its step clips model.optim_parameters()"))


def _clip_copies(wrappers: "ScalerWrappers", parameters: cst.Call) -> None:
    """``model.parameters()`` -> ``model.optim_parameters()``; a model parameter of the
    function is a RoundPipe model there."""
    owner = cst.ensure_type(cst.ensure_type(parameters.func, cst.Attribute).value, cst.Name)
    wrappers.plan.edits.replace_expression(
        parameters.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
    )
    scope = wrappers.facts.scope(owner)
    if scope is not None and any(isinstance(getattr(a, "node", None), cst.Param) for a in scope[owner.value]):
        wrappers.plan.wrapped_models.append((scope, owner.value, 0))


def _is_step_of(statement: cst.CSTNode, instance: str, optimizer: str, roles: Mapping[str, str]) -> bool:
    value = only_expression(statement)
    return (
        isinstance(value, cst.Call)
        and m.matches(value.func, m.Attribute(value=m.Name(instance), attr=m.Name()))
        and roles.get(cst.ensure_type(value.func, cst.Attribute).attr.value) == "step"
        and bool(value.args)
        and m.matches(value.args[0], m.Arg(value=m.Name(optimizer), keyword=None))
    )


def _stepped_model(
    wrappers: "ScalerWrappers", block: Union[cst.IndentedBlock, cst.Module], step: cst.BaseStatement, optimizer: str
) -> Optional[str]:
    """The model the helper's step of ``optimizer`` steps, as this function names it: the
    model clipped before it in the block, else the one ``optimizer`` is built on here."""
    facts = wrappers.facts
    body = list(block.body)
    for statement in reversed(body[: body.index(step)]):
        for call in facts.subtree(statement, cst.Call):
            if m.matches(call, PARAMETERS_CALL) and isinstance(facts.parent(facts.parent(call)), cst.Call):
                return cst.ensure_type(cst.ensure_type(call.func, cst.Attribute).value, cst.Name).value
    root = facts.enclosing(step, (cst.FunctionDef,)) or facts.module
    for assign in facts.subtree(root, cst.Assign):
        if m.matches(assign, m.Assign(targets=[m.AssignTarget(target=m.Name(optimizer))], value=m.Call())):
            owners = [c for c in facts.subtree(assign.value, cst.Call) if m.matches(c, PARAMETERS_CALL)]
            models = {cst.ensure_type(cst.ensure_type(c.func, cst.Attribute).value, cst.Name).value for c in owners}
            if len(models) == 1:
                return models.pop()
    return None


# ---------------------------------------------------------------------- helpers
def _scaler_attributes(root: cst.CSTNode, scaler: str) -> List[cst.Attribute]:
    pattern = m.Attribute(value=m.Name("self"), attr=m.Name(scaler))
    return [cst.ensure_type(a, cst.Attribute) for a in m.findall(root, pattern)]


def _scaler_call(scaler: str, method: str, argument: Optional[str]) -> m.Call:
    """``self.<scaler>.<method>(<argument>)`` (no argument when ``argument`` is None)."""
    return m.Call(
        func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler)), attr=m.Name(method)),
        args=[m.Arg(value=m.Name(argument), keyword=None)] if argument is not None else [],
    )


def never_an_optimizer(call: cst.Call) -> bool:
    """A call that may read ``model.parameters()`` but returns a number, never an optimizer:
    a gradient clipping (``torch.nn.utils.clip_grad_norm_(...)`` and its kin, a norm) or a
    builtin reduction (``sum(p.numel() for p in model.parameters())``)."""
    name = _clipping_name(call)
    return name in _CLIPPING or isinstance(call.func, cst.Name) and name in _REDUCTIONS


def _clipping_name(call: cst.Call) -> Optional[str]:
    """The called function's last name (``clip_grad_norm_`` of ``torch.nn.utils.clip_grad_norm_``)."""
    func = call.func
    return func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) else None


def _is_scaler_line(statement: cst.BaseStatement, scaler: str) -> bool:
    """``self.<scaler>.<method>(...)`` or ``return self.<scaler>.<method>(...)`` (perhaps
    ``.backward()`` of it), alone on its line."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return False
    small = statement.body[0]
    value = small.value if isinstance(small, (cst.Return, cst.Expr)) else None
    on_scaler = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler))))
    return value is not None and m.matches(value, on_scaler | m.Call(func=m.Attribute(value=on_scaler)))


def _matches_each(statements: List[cst.BaseStatement], patterns: List[m.BaseMatcherNode]) -> bool:
    """Each statement is a one-statement line matching its pattern (an expression's value, or
    a ``return``)."""
    if len(statements) != len(patterns):
        return False
    for statement, pattern in zip(statements, patterns):
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return False
        small = statement.body[0]
        if not m.matches(small if isinstance(small, cst.Return) else getattr(small, "value", small), pattern):
            return False
    return True
