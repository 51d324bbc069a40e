"""Optimizer wrapper classes that own the scaler (fairseq's AMP optimizers, in spirit),
recognised as a whole and migrated with every place that builds them (issue 10, shapes 2 and 3).

The shape: a class holding ``self.<scaler> = GradScaler(...)`` next to the torch optimizer it
wraps, behind an optimizer-like interface (``backward``, ``step``, ``zero_grad``, often
``clip_grad_norm``, ``multiply_grads``, ``get_lr``/``set_lr``, ``state_dict`` with the scaler's
state under a key) that the training loop calls in turn::

    optimizer.backward(loss)                 # self.scaler.scale(loss).backward()
    grad_norm = optimizer.clip_grad_norm(c)  # self.scaler.unscale_(self.optimizer); clip_grad_norm_(...)
    optimizer.step()                         # self.scaler.step(self.optimizer); self.scaler.update()

Each method is migrated by what it does, so the interface and the call order stay:

* a *backward method* (``self.<scaler>.scale(x).backward(...)``) stays on the caller's thread
  as written: RoundPipe's autograd form, the backward accumulates the model's gradients;
* a *gradient method* (it unscales, steps through the scaler, clips or touches ``.grad``)
  runs its body as a step function in ``self._model.step``, which first hands the
  accumulated gradients to the optimizer copies; a trailing ``self.<scaler>.update()`` stays
  after the step, on the caller's thread; a trailing ``return <value>`` is computed inside the
  step function and returned once the step is waited for (``is_async=False``, so a returned
  norm exists when the call returns). Under ``--exact`` every step is waited for. Several
  gradient methods per iteration are several steps: the copies keep their gradients until
  the optimizer zeroes them, and a later step with no new backward hands over nothing;
* ``zero_grad`` also clears the model's accumulated gradients (``self._model.zero_grad()``),
  which the original's optimizer cleared as they were the same tensors;
* in the asynchronous (default) form, every other method that touches state the step
  functions use (the optimizer, its parameters) waits for the running step first
  (``self._model.synchronize()``), so learning-rate writes, state dicts and ``zero_grad``
  are ordered after it.

``__init__`` takes the RoundPipe model as the keyword-only ``model`` argument and the scaler
becomes ``roundpipe.GradScaler``. :class:`migrate.scaler_wrapper.ScalerWrappers` finds the
classes, rewrites every construction (``Wrapper(model.optim_parameters(), ..., model=model)``)
and follows the instances; in the asynchronous form, the caller's writes of an optimizer it
handed to the wrapper wait for the step (:func:`order_handed_optimizer_writes`), and an
instance used other than through its methods is refused (:func:`check_instance_uses`). What
the class does beyond this is refused precisely (RPM111, naming the method and why). Pure
source analysis.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Set, Tuple

import libcst as cst
import libcst.matchers as m

from .gradient_reads import check_gradient_reads_after_call
from .names import SCALER_STATE_METHODS
from .optimizer_writes import optimizer_writes
from .plan import Blocked
from .rules.scaler_constructor import rewrite_constructor
from .syntax import code, is_docstring, leading_lines, only_assignment, only_expression

if TYPE_CHECKING:
    from libcst.metadata import Scope

    from .scaler_wrapper import ScalerWrappers

__all__ = [
    "OptimizerWrapperClass",
    "GradientMethod",
    "plan_gradient_method",
    "recognise_optimizer_wrapper",
    "plan_optimizer_wrapper",
    "is_optimizer_like",
    "order_handed_optimizer_writes",
    "check_instance_uses",
    "check_gradient_reads_after_steps",
]

#: the methods that make a class holding a scaler an optimizer wrapper
OPTIMIZER_INTERFACE = frozenset({"backward", "step", "zero_grad"})

#: calls whose presence in a method means it works on the gradients
_GRADIENT_CALLS = frozenset({"clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_grad_value"})


def is_optimizer_like(node: ast.ClassDef) -> bool:
    """``node`` (a class of another file, as :mod:`ast` parses it) has an optimizer's
    interface and no ``__call__``: a candidate optimizer wrapper."""
    methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
    return OPTIMIZER_INTERFACE <= methods and "__call__" not in methods


@dataclass
class GradientMethod:
    """A method whose body becomes a step function: ``node.body.body[first:]`` is the body,
    ``updates`` when it ends with ``self.<scaler>.update()``, ``returned`` the value of a
    trailing ``return`` (None for none, or a bare one)."""

    node: cst.FunctionDef
    first: int
    updates: bool
    returned: Optional[cst.BaseExpression]
    rebound: List[str]  # parameters the body assigns (``nonlocal`` in the step function)


@dataclass
class OptimizerWrapperClass:
    """A recognised optimizer wrapper: ``scaler`` and ``optimizer`` are the attributes holding
    the GradScaler and the optimizer it steps; ``waiting`` the main-thread methods that touch
    what the step functions use (they wait for the step in the asynchronous form)."""

    node: cst.ClassDef
    scaler: str
    optimizer: str
    constructors: Tuple[cst.Call, ...]
    init: cst.FunctionDef
    zero_grad: cst.FunctionDef
    gradient_methods: List[GradientMethod] = field(default_factory=list)
    waiting: List[cst.FunctionDef] = field(default_factory=list)


def recognise_optimizer_wrapper(wrappers: "ScalerWrappers", node: cst.ClassDef) -> Optional[OptimizerWrapperClass]:
    """The optimizer wrapper in ``node``; None when it is none (no optimizer interface, no
    torch GradScaler on ``self``) or one already in RoundPipe form (its backwards are then
    claimed). Blocked (RPM111) for a class of this kind that the migration does not handle;
    its scaler and backwards are claimed first, so that nothing else reports them."""
    methods = {s.name.value: s for s in node.body.body if isinstance(s, cst.FunctionDef)}
    if not OPTIMIZER_INTERFACE <= set(methods) or "__call__" in methods:
        return None
    stored = wrappers.claim_torch_scalers(node)
    if not stored:
        return None
    return _Recogniser(wrappers, node, methods, stored).run()


class _Recogniser:
    """Classifies the methods of one candidate class (see the module docstring)."""

    def __init__(
        self,
        wrappers: "ScalerWrappers",
        node: cst.ClassDef,
        methods: Dict[str, cst.FunctionDef],
        stored: List[Tuple[str, cst.Call]],
    ) -> None:
        self.wrappers = wrappers
        self.facts = wrappers.facts
        self.node = node
        self.methods = methods  # name -> the method
        self.stored = stored  # (attribute, GradScaler call) of each `self.<attribute> = GradScaler(...)`
        self.name = node.name.value

    def refuse(self, at: cst.CSTNode, why: str) -> Blocked:
        return Blocked(at, "RPM111", f"optimizer wrapper {self.name}: {why}; not migrated (migrate it by hand)")

    def run(self) -> OptimizerWrapperClass:
        if self.node.bases:
            raise self.refuse(self.node, "it inherits from another class, whose methods the migration does not see")
        init = self.methods.get("__init__")
        attributes = {a for a, _ in self.stored}
        if len(attributes) != 1 or init is None or not all(self.facts.within(c, init) for _, c in self.stored):
            raise self.refuse(
                self.stored[0][1], "its GradScaler must be built once in __init__, as `self.<name> = GradScaler(...)`"
            )
        scaler = attributes.pop()
        steps = self._scaler_calls(self.node, scaler, "step")
        if len(steps) != 1 or not _one_self_attribute(steps[0]):
            raise self.refuse(
                steps[0] if steps else self.node, f"it must call self.{scaler}.step(self.<optimizer>) once"
            )
        optimizer = steps[0].args[0].value.attr.value  # type: ignore[attr-defined]
        zero_grad = self.methods["zero_grad"]
        constructors = tuple(c for _, c in self.stored)
        wrapper = OptimizerWrapperClass(self.node, scaler, optimizer, constructors, init, zero_grad)
        backward_methods, others = [], []
        for method in self.methods.values():
            if method is init:
                continue
            kind = self._classify(method, scaler, optimizer)
            if kind == "gradient":
                wrapper.gradient_methods.append(self._gradient_method(method, scaler))
            elif kind == "backward":
                backward_methods.append(method)
            else:
                others.append(method)
        # the optimizer and the parameters it steps: a method handing them to a helper (a
        # grad-norm function) or looping over them may read their gradients, which exist on
        # the optimizer copies only inside a step: it runs in one too
        parameters = _handed_attributes([init, *(g.node for g in wrapper.gradient_methods)]) - {scaler}
        for method in others:
            if method is not zero_grad and parameters & _handed_attributes([method]):
                wrapper.gradient_methods.append(self._gradient_method(method, scaler))
        wrapper.gradient_methods.sort(key=lambda g: self.facts.order(g.node))  # generated names in source order
        if not backward_methods:
            raise self.refuse(self.methods["backward"], f"no method runs `self.{scaler}.scale(loss).backward()`")
        shared = {a for g in wrapper.gradient_methods for a in _self_attributes(g.node)} - {scaler}
        if any(g.node is zero_grad for g in wrapper.gradient_methods):
            raise self.refuse(zero_grad, "zero_grad() works on the gradients itself (`.grad`, clipping or the scaler)")
        for method in self.methods.values():
            if method is init or any(g.node is method for g in wrapper.gradient_methods):
                continue
            if shared & _self_attributes(method):
                self._check_not_handed_out(method, shared)
                wrapper.waiting.append(method)
        return wrapper

    # ------------------------------------------------------------------ classify
    def _classify(self, method: cst.FunctionDef, scaler: str, optimizer: str) -> str:
        """``"backward"``, ``"gradient"`` or ``"other"``; Blocked for a use of the scaler
        the migration does not keep."""
        name = method.name.value
        backward = gradient = False
        for attribute in self._scaler_attributes(method, scaler):
            parent = self.facts.parent(attribute)
            call = self.facts.parent(parent)
            if not (isinstance(parent, cst.Attribute) and isinstance(call, cst.Call) and call.func is parent):
                raise self.refuse(attribute, f"{name}() hands the scaler on (`{code(parent or attribute)}`)")
            used = parent.attr.value
            if used == "scale":
                self._check_backward(method, call, scaler)
                backward = True
            elif used in ("unscale_", "step"):
                if not (_one_self_attribute(call) and call.args[0].value.attr.value == optimizer):  # type: ignore[attr-defined]
                    raise self.refuse(call, f"`{code(call)}` in {name}() is not given self.{optimizer} alone")
                gradient = True
            elif used == "update":
                gradient = True
            elif used not in SCALER_STATE_METHODS:
                raise self.refuse(call, f"`{code(call)}` in {name}() is not a use of the scaler the migration keeps")
        gradient = gradient or self._touches_gradients(method)
        if backward and gradient:
            raise self.refuse(method, f"{name}() both backpropagates and works on the gradients")
        return "backward" if backward else "gradient" if gradient else "other"

    def _check_backward(self, method: cst.FunctionDef, scale: cst.Call, scaler: str) -> None:
        """``self.<scaler>.scale(x).backward(...)`` with no argument, ``retain_graph=...`` or
        ``create_graph=<name or False>``: kept on the caller's thread as written."""
        name = method.name.value
        outer = self.facts.parent(scale)
        backward = self.facts.parent(outer)
        if not (
            isinstance(outer, cst.Attribute)
            and outer.attr.value == "backward"
            and isinstance(backward, cst.Call)
            and backward.func is outer
        ):
            raise self.refuse(scale, f"`{code(scale)}` in {name}() is not followed by `.backward()`")
        for arg in backward.args:
            keyword = arg.keyword.value if arg.keyword is not None else None
            if keyword == "retain_graph":
                continue
            if keyword == "create_graph" and (
                isinstance(arg.value, cst.Name) and arg.value.value != "True" or m.matches(arg.value, m.Name("False"))
            ):
                continue
            raise self.refuse(
                backward, f"`{code(backward)}` in {name}(): only retain_graph= and create_graph=<name> are kept"
            )

    def _touches_gradients(self, method: cst.FunctionDef) -> bool:
        for attribute in self.facts.subtree(method, cst.Attribute):
            if attribute.attr.value == "grad" or attribute.attr.value in _GRADIENT_CALLS:
                return True
        return any(n.value in _GRADIENT_CALLS for n in self.facts.subtree(method, cst.Name))

    # ------------------------------------------------------------------ gradient methods
    def _gradient_method(self, method: cst.FunctionDef, scaler: str) -> GradientMethod:
        """The checks a body that becomes a step function passes (see :class:`GradientMethod`)."""
        name = method.name.value
        if method.decorators:
            raise self.refuse(method, f"{name}() is decorated, and a decorator would not apply on the optimizer thread")
        body = method.body
        if not isinstance(body, cst.IndentedBlock):
            raise self.refuse(method, f"{name}() must have its body on lines of its own")
        statements = list(body.body)
        first = 1 if statements and is_docstring(statements[0]) else 0
        statements = statements[first:]
        last = statements[-1] if statements else None
        updates = _is_scaler_call(only_expression(last), scaler, "update") if last is not None else False
        returned: Optional[cst.BaseExpression] = None
        trailing_return = isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)
        if trailing_return:
            returned = last.body[0].value  # type: ignore[union-attr]
        moved = statements[:-1] if updates or trailing_return else statements
        if not moved and (returned is None or m.matches(returned, m.Name("None"))):
            raise self.refuse(method, f"{name}() has no work for a step function")
        for update in self._scaler_calls(method, scaler, "update"):
            if not updates or not self.facts.within(update, last) or update.args:  # type: ignore[arg-type]
                raise self.refuse(
                    update, f"self.{scaler}.update() must end {name}(), on a line of its own, no arguments"
                )
        for statement in moved:
            found = m.findall(statement, m.Return() | m.Yield() | m.Nonlocal() | m.Global() | m.Await())
            if found:
                raise self.refuse(found[0], f"{name}() returns early, yields or rebinds outer names")
            for attribute in self.facts.subtree(statement, cst.Attribute):
                if m.matches(attribute, m.Attribute(value=m.Name("self"))) and attribute.attr.value in self.methods:
                    raise self.refuse(
                        attribute,
                        f"{name}() calls {attribute.attr.value}(), another method of the wrapper: each method's "
                        "gradient work becomes its own step, and a step cannot run inside another",
                    )
            for state in self._scaler_attributes(statement, scaler):
                parent = self.facts.parent(state)
                if isinstance(parent, cst.Attribute) and parent.attr.value not in ("unscale_", "step"):
                    raise self.refuse(parent, f"`{code(parent)}` in {name}()'s step work is not migrated")
        params = {p.name.value for p in (*method.params.params, *method.params.kwonly_params)}
        assigned = {
            n.value
            for statement in moved
            for target in m.findall(statement, m.AssignTarget() | m.AugAssign() | m.AnnAssign())
            for n in m.findall(target.target, m.Name())  # type: ignore[attr-defined]
            if isinstance(n, cst.Name)
        }
        return GradientMethod(method, first, updates, returned, sorted(params & assigned))

    def _check_not_handed_out(self, method: cst.FunctionDef, shared: Set[str]) -> None:
        """In the asynchronous form a main-thread method may read shared state after waiting
        for the step, but not hand an object of it out (``return self.optimizer``, ``return
        self.optimizer.param_groups``): the caller would use it unordered with the step."""
        if self.wrappers.rules.exact:
            return
        for returned in self.facts.subtree(method, cst.Return):
            value = returned.value
            while isinstance(value, cst.Attribute) and not m.matches(value.value, m.Name("self")):
                value = value.value
            if isinstance(value, cst.Attribute) and value.attr.value in shared:
                raise self.refuse(
                    returned,
                    f"{method.name.value}() hands `{code(returned.value)}` out, which the asynchronous step uses; "  # type: ignore[arg-type]
                    "callers would use it unordered with that step (run with --exact, or use it inside the class)",
                )

    # ------------------------------------------------------------------ lookups
    def _scaler_attributes(self, root: cst.CSTNode, scaler: str) -> List[cst.Attribute]:
        pattern = m.Attribute(value=m.Name("self"), attr=m.Name(scaler))
        return [a for a in self.facts.subtree(root, cst.Attribute) if m.matches(a, pattern)]

    def _scaler_calls(self, root: cst.CSTNode, scaler: str, method: str) -> List[cst.Call]:
        return [c for c in self.facts.subtree(root, cst.Call) if _is_scaler_call(c, scaler, method)]


# ---------------------------------------------------------------------- emit
def plan_optimizer_wrapper(wrappers: "ScalerWrappers", wrapper: OptimizerWrapperClass) -> None:
    """Plan the class's rewrite (see the module docstring)."""
    rules, plan = wrappers.rules, wrappers.plan
    for constructor in wrapper.constructors:
        rewrite_constructor(rules, constructor, wrappers.facts.scaler_kind(constructor))
    model = wrappers.give_model(wrapper.node, wrapper.init)
    steps = []
    for gradient in wrapper.gradient_methods:
        step_fn = plan.fresh("_step_fn")
        waits = rules.exact or _returns_a_value(gradient)
        plan_gradient_method(wrappers, gradient, model, step_fn, waits)
        steps.append(
            f"{gradient.node.name.value}() -> self.{model}.step({step_fn}{', is_async=False' if waits else ''})"
        )
    touched = [*wrapper.waiting, *([] if wrapper.zero_grad in wrapper.waiting else [wrapper.zero_grad])]
    for method in touched:
        first = 1 if is_docstring(method.body.body[0]) else 0
        added = []
        if not rules.exact and method in wrapper.waiting:
            added.append(cst.parse_statement(f"self.{model}.synchronize()\n"))
        if method is wrapper.zero_grad:
            added.append(cst.parse_statement(f"self.{model}.zero_grad()\n"))
        if added:
            plan.edits.insert_before(method.body, first, added)
    waited = "" if rules.exact else f"; {', '.join(m.name.value + '()' for m in wrapper.waiting)} wait for the step"
    plan.rewrites.append(
        (
            wrapper.node,
            f"optimizer wrapper {wrapper.node.name.value}: roundpipe.GradScaler, the model passed as model=; "
            f"autograd form: backward kept, {'; '.join(steps)}; zero_grad() clears the model's gradients too"
            + (waited if wrapper.waiting else ""),
        )
    )


def plan_gradient_method(
    wrappers: "ScalerWrappers",
    method: GradientMethod,
    model: str,
    step_fn: str,
    waits: bool,
) -> None:
    """``method``'s body -> ``def <step_fn>(): ...`` + ``self.<model>.step(<step_fn>)``, then
    the update and the return."""
    plan = wrappers.plan
    body = method.node.body
    moved = list(body.body)[method.first :]
    plan.step_statements.update(n for s in moved for n in wrappers.facts.subtree(s, cst.BaseStatement))
    result = _result_name(method) if _returns_a_value(method) else None

    def build(updated: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
        tail: List[cst.BaseStatement] = []
        inside = list(updated)
        if method.updates or _ends_with_return(method):
            last = inside.pop()
            if method.updates:  # --exact: after the waited-for step a plain update() is torch's
                tail.append(last)
            elif result is not None:
                assert isinstance(last, cst.SimpleStatementLine)
                value = cst.ensure_type(last.body[0], cst.Return).value
                assert value is not None
                inside.append(last.with_changes(body=[cst.Assign([cst.AssignTarget(cst.Name(result))], value)]))
                tail.append(cst.parse_statement(f"return {result}\n"))
            else:
                tail.append(last)
        outer = sorted({*method.rebound, *([result] if result else [])})
        head = [cst.parse_statement(f"nonlocal {', '.join(outer)}\n")] if outer else []
        definition = cst.ensure_type(cst.parse_statement(f"def {step_fn}():\n    pass\n"), cst.FunctionDef)
        definition = definition.with_changes(
            leading_lines=leading_lines(inside[0]),
            body=definition.body.with_changes(body=[*head, inside[0].with_changes(leading_lines=()), *inside[1:]]),
        )
        before = [cst.parse_statement(f"{result} = None\n")] if result else []
        step = cst.parse_statement(f"self.{model}.step({step_fn}{', is_async=False' if waits else ''})\n")
        return [*before, definition, step, *tail]

    plan.edits.replace_range(body, method.first, len(body.body), build)


def _returns_a_value(method: GradientMethod) -> bool:
    return method.returned is not None and not m.matches(method.returned, m.Name("None"))


def _ends_with_return(method: GradientMethod) -> bool:
    last = list(method.node.body.body)[-1]
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[0], cst.Return)


def _result_name(method: GradientMethod) -> str:
    """A local name for the returned value that the method does not use."""
    used = {n.value for n in m.findall(method.node, m.Name())}  # type: ignore[attr-defined]
    name, counter = "result", 2
    while name in used:
        name, counter = f"result_{counter}", counter + 1
    return name


def _handed_attributes(roots: List[cst.FunctionDef]) -> Set[str]:
    """The attributes of ``self`` that the ``roots`` hand to a call as a whole (``f(self.params)``)
    or loop over (``for p in self.params``, also in comprehensions)."""
    found: Set[str] = set()
    pattern = m.Attribute(value=m.Name("self"), attr=m.Name())
    for root in roots:
        for node in m.findall(root, m.Arg(value=pattern) | m.For(iter=pattern) | m.CompFor(iter=pattern)):
            held = cst.ensure_type(node.value if isinstance(node, cst.Arg) else node.iter, cst.Attribute)  # type: ignore[attr-defined]
            found.add(held.attr.value)
    return found


def _self_attributes(root: cst.CSTNode) -> Set[str]:
    return {a.attr.value for a in m.findall(root, m.Attribute(value=m.Name("self"), attr=m.Name()))}  # type: ignore[attr-defined]


def _one_self_attribute(call: cst.Call) -> bool:
    """``call`` is given exactly one positional ``self.<name>``."""
    return len(call.args) == 1 and m.matches(
        call.args[0], m.Arg(value=m.Attribute(value=m.Name("self"), attr=m.Name()), keyword=None, star="")
    )


def _is_scaler_call(node: Optional[cst.CSTNode], scaler: str, method: str) -> bool:
    return node is not None and m.matches(
        node,
        m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name(scaler)), attr=m.Name(method))),
    )


def order_handed_optimizer_writes(wrappers: "ScalerWrappers", call: cst.Call, model: str) -> None:
    """``Wrapper(optimizer, ...)`` handed a torch optimizer its caller keeps: in the
    asynchronous form, the caller's later main-thread writes of that optimizer's state
    (learning-rate loops, scheduler steps, handing it to a call) wait for the running step
    first (``model.synchronize()`` before them), as they would race with it otherwise."""
    if wrappers.rules.exact:
        return
    facts = wrappers.facts
    statement = facts.statement_of(call)
    root = facts.enclosing(call, (cst.FunctionDef,)) or facts.module
    handed = {a.value.value for a in call.args if isinstance(a.value, cst.Name)}
    for assign in facts.subtree(root, cst.Assign):
        target = assign.targets[0].target if len(assign.targets) == 1 else None
        if not (
            isinstance(target, cst.Name)
            and target.value in handed
            and isinstance(assign.value, cst.Call)
            and facts.calls_prefix(assign.value, ["torch.optim."])
            and facts.order(assign) < facts.order(call)
        ):
            continue
        writes = optimizer_writes(facts, root, target.value, wrappers.is_scheduler, {statement}, set())
        for write in writes:
            if facts.order(write) > facts.order(statement):
                wrappers.plan.synchronize_before.append((write, model))


def check_instance_uses(wrappers: "ScalerWrappers", classes: Set[str], defined: Dict[str, cst.ClassDef]) -> None:
    """In the asynchronous form, code outside an optimizer wrapper reaches the shared state
    only through its methods (which wait for the running step where needed): an instance of
    one of the ``classes`` (built in this file, or fed to a parameter here by another file)
    whose attribute is read or written other than by calling a method (``optimizer.optimizer
    .param_groups``, ``optimizer.scaler``) is refused (RPM111), as that use would race with
    the step; the class, when ``defined`` here, is reported too."""
    if wrappers.rules.exact:
        return
    for access, owner in _instance_accesses(wrappers, classes):
        parent = wrappers.facts.parent(access)
        if isinstance(parent, cst.Attribute) and parent.value is access:
            called = wrappers.facts.parent(parent)
            if not (isinstance(called, cst.Call) and called.func is parent):
                _refuse_unordered_use(wrappers, parent, defined.get(owner or ""))


def check_gradient_reads_after_steps(wrappers: "ScalerWrappers", classes: Set[str]) -> None:
    """``optimizer.step()`` of an instance of one of the optimizer wrapper ``classes`` runs a
    migrated step: a ``.grad`` read after it in the calling function is refused (RPM140,
    :func:`migrate.gradient_reads.check_gradient_reads_after_call`)."""
    facts = wrappers.facts
    for access, _ in _instance_accesses(wrappers, classes):
        method = facts.parent(access)
        call = facts.parent(method)
        if (
            isinstance(method, cst.Attribute)
            and method.value is access
            and method.attr.value == "step"
            and isinstance(call, cst.Call)
            and call.func is method
        ):
            check_gradient_reads_after_call(facts, wrappers.plan, call)


def _instance_accesses(wrappers: "ScalerWrappers", classes: Set[str]) -> List[Tuple[cst.BaseExpression, Optional[str]]]:
    """The reads of the instances of ``classes`` (built in this file, or fed to a parameter
    here by another file) with the name of their class where built here; instances are
    followed into the same-file functions they are handed to."""
    facts = wrappers.facts
    instances: List[Tuple["Scope", str, Optional[str]]] = []  # scope, name, its class
    for call in facts.subtree(facts.module, cst.Call):
        small = only_assignment(facts.parent(facts.parent(call)))
        if (
            isinstance(call.func, cst.Name)
            and call.func.value in classes
            and small is not None
            and small.value is call
            and len(small.targets) == 1
            and isinstance(small.targets[0].target, cst.Name)
        ):
            scope = facts.scope(small)
            if scope is not None:
                instances.append((scope, small.targets[0].target.value, call.func.value))
    for function in facts.subtree(facts.module, cst.FunctionDef):
        for param in function.params.params:
            if (function.name.value, param.name.value) in wrappers.context.optimizer_params and function.body.body:
                scope = facts.scope(function.body.body[0])
                if scope is not None:
                    instances.append((scope, param.name.value, None))
    found: List[Tuple[cst.BaseExpression, Optional[str]]] = []
    seen: Set[Tuple[int, str]] = set()
    while instances:
        scope, name, owner = instances.pop()
        if (id(scope), name) in seen:
            continue
        seen.add((id(scope), name))
        for access in facts.accesses(name, scope):
            found.append((access, owner))
            parent = facts.parent(access)
            if isinstance(parent, cst.Arg):
                target = wrappers.rules.parameter_fed_by(parent)
                if target is not None:
                    instances.append((*target, owner))
    return found


def _refuse_unordered_use(wrappers: "ScalerWrappers", use: cst.Attribute, owner: Optional[cst.ClassDef]) -> None:
    """Raise the refusal of ``use``; record one for the class ``owner`` too, so that the
    class's own lines name the blocker when the module holds both."""
    if owner is not None:
        wrappers.plan.blocked.append(
            Blocked(
                owner,
                "RPM111",
                f"optimizer wrapper {owner.name.value}: an instance is used outside its methods "
                f"(`{code(use)}`, reported where it is used); not migrated",
            )
        )
    raise Blocked(
        use,
        "RPM111",
        f"`{code(use)}` uses the optimizer wrapper's state outside its methods; in the asynchronous form "
        "that would race with the wrapper's step (use a method of the wrapper, or run with --exact); not migrated",
    )
