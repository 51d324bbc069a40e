"""Project functions that work on the model's gradients between the backward and the step.

Real trainers clip, measure and drop gradients through their own helpers between the
backward (or ``scaler.unscale_``) and the step: DINO's ``param_norms =
clip_gradients(student, clip)`` (a loop over ``model.parameters()`` scaling each
``p.grad``) and ``cancel_gradients_last_layer(epoch, student, n)`` (``p.grad = None`` for
some names), timm-style ``dispatch_clip_grad(model.parameters(), value)``. Such a call
moves into the step function like ``clip_grad_norm_``, when the helper's work is on
gradients only (:func:`helper_kind`):

* a parameter of the helper used as a model only through ``.parameters()`` /
  ``.named_parameters()``, iterated or handed to a clip function or another helper, never
  counted or listed (the call must hand it the trained model: inside the step
  function the call runs under ``roundpipe.OptimizerCtx()``, where those return the
  optimizer copies, which hold the gradients there), or one iterated as parameters (the
  call must hand it ``model.parameters()``, which becomes ``model.optim_parameters()``);
* each walked parameter ``p`` read only through ``p.grad`` (read, changed in place or set),
  and its metadata (``p.requires_grad``, ``p.shape``, ...); each parameter name only tested
  with ``"text" in name`` or ``name.endswith(...)`` (the copies' names carry a ``model.``
  prefix, which these tests do not see);
* no writes to anything but its own locals and ``p.grad``, no ``global``/``nonlocal``, and
  calls only to builtins, ``torch`` functions, methods of its own values and other such
  helpers of the module (followed :data:`DEPTH` calls deep).

A helper given the model that does anything else (reads or writes the weights, reads
another attribute of the model, prints, writes state outside its locals) is not gradient
work: the step is refused with RPM158 naming the helper and what it touches
(:func:`why_not_moved`).

The helper may be a top-level function of another given file the module imports
(``utils.clip_gradients(student, clip)``, ``from utils import clip_gradients as clip``,
``from . import utils``; :mod:`migrate.foreign_functions`): it is judged in its own file
with the same checks, and that file is not rewritten.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Set, Tuple, Union

import libcst as cst
import libcst.matchers as m
from libcst.metadata import Assignment

from .attribute_aliases import local_aliases
from .foreign_functions import imported_function
from .helper_reads import DEPTH, called_function
from .names import CLIP_FUNCTIONS, ModuleFacts, argument_for
from .plan import Blocked
from .syntax import PARAMETERS_CALL, code, dotted, only_assignment, only_expression

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = [
    "CODE",
    "DEPTH",
    "HelperRoles",
    "helper_kind",
    "in_optimizer_context",
    "is_gradient_only",
    "walks_gradients",
    "needs_optimizer_context",
    "roles_of",
    "why_not_moved",
]

CODE = "RPM158"

#: timm's clip dispatcher (``timm.utils.dispatch_clip_grad(parameters, value, mode="norm")``)
_LIBRARY_DISPATCH = frozenset({"timm.utils.dispatch_clip_grad", "timm.utils.clip_grad.dispatch_clip_grad"})
#: its modes that run ``clip_grad_norm_`` / ``clip_grad_value_`` on the parameters handed
_FIXED_MODES = frozenset({"'norm'", "'value'"})

#: builtins a gradient helper may call
_BUILTINS = frozenset(
    {"abs", "all", "any", "bool", "enumerate", "float", "int", "isinstance", "iter", "len", "list", "max", "min"}
    | {"next", "range", "reversed", "round", "sorted", "sum", "tuple", "zip"}
)
#: what a parameter tells without its values
_METADATA = frozenset({"device", "dtype", "is_leaf", "ndim", "requires_grad", "shape"})
_WALKS = frozenset({"parameters", "named_parameters"})
_LOOPS = (cst.For, cst.CompFor)  # what binds a walked parameter
_PREFIX = "model."  # the optimizer copies' names (optim_named_parameters)


@dataclass(frozen=True)
class HelperRoles:
    """What a gradient helper is handed: ``models`` (its parameters, or ``self.x`` in a
    method, walked through ``.parameters()``/``.named_parameters()``) and ``iterables``
    (its parameters iterated as model parameters)."""

    models: Tuple[str, ...]
    iterables: Tuple[str, ...]


def helper_kind(step: "StepBuilder", statement: cst.BaseStatement) -> Optional[str]:
    """``"clip"`` for ``helper(...)``, ``"measure"`` for ``name = helper(...)``, where
    ``helper`` is a gradient helper of this module or another given file (see the module's contract); else None."""
    call, kind = _helper_call(statement)
    if call is None or _after_a_step(step.facts, statement):
        return None
    if kind == "clip" and _library_dispatch_mode(step.facts, call) in _FIXED_MODES:
        return "clip"  # timm's dispatch_clip_grad(parameters, value, mode="norm"): clip_grad_norm_
    found = _gradient_helper(step, call)
    if found is None:
        return None
    return kind if _touch(*found, DEPTH, set()) is None else None


def why_not_moved(step: "StepBuilder", statement: cst.BaseStatement) -> Optional[Blocked]:
    """RPM158 at the first call in ``statement`` of a helper (of this module or another given
    file) that walks the
    parameters of what it is handed but does more than gradient work, naming the helper and
    what it touches; None when there is none."""
    for call in step.facts.subtree(statement, cst.Call):
        mode = _library_dispatch_mode(step.facts, call)
        if mode is not None and mode not in _FIXED_MODES:
            return Blocked(
                call,
                CODE,
                f"timm's dispatch_clip_grad() with the clip mode `{mode}`: only the modes 'norm' and 'value' "
                "(clip_grad_norm_, clip_grad_value_) are known to work on gradients alone ('agc' reads the "
                "weights); not migrated",
            )
        found = _gradient_helper(step, call)
        if found is None:
            continue
        function = found[1]
        touch = _touch(*found, DEPTH, set())
        if touch is not None:
            return Blocked(
                call,
                CODE,
                f"{function.name.value}() walks the model's parameters between the backward and the "
                f"step but also {touch}: only gradient work can move into the step function, where "
                "the parameters are the optimizer copies; not migrated",
            )
    return None


def needs_optimizer_context(step: "StepBuilder", statements: Sequence[cst.BaseStatement], model: str) -> bool:
    """True when a gradient helper call among ``statements`` (the step's, nested ones
    included) is handed the model itself, so the step function must run it under
    ``roundpipe.OptimizerCtx()``. Raises :class:`Blocked` (RPM158) for a call that hands a
    helper something else than ``model`` (or ``model.parameters()``) to walk, or, in the
    asynchronous form, a value the enclosing function rebinds (a loop variable), which the
    step function would read late."""
    needed = False
    for statement in statements:
        if step.classify(statement) not in ("clip", "measure"):
            continue
        call, _ = _helper_call(statement)
        found = _gradient_helper(step, call) if call is not None else None
        if call is None or found is None:
            continue
        facts, function = found
        roles = roles_of(facts, function)
        skipped = 1 if _is_method(facts, function) else 0
        spellings = _model_spellings(step, call, model)
        for name in roles.models:
            handed = name if name.startswith("self.") else dotted(argument_for(call, function, name, skipped))
            if handed not in spellings:
                _refuse_handed(call, function, name, model)
            needed = True
        for name in roles.iterables:
            handed_value = argument_for(call, function, name, skipped)
            if handed_value is None or not any(_parameters_of(handed_value, s) for s in spellings):
                _refuse_handed(call, function, name, model)
        if not step.rules.exact:
            _refuse_rebound_arguments(step, call, function, spellings)
    return needed


def in_optimizer_context(statements: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    """``statements`` (a step function's body) inside ``with roundpipe.OptimizerCtx():``,
    the first one's leading lines kept in front."""
    first = statements[0]
    leading = getattr(first, "leading_lines", ())
    body = [first.with_changes(leading_lines=()), *statements[1:]] if leading else list(statements)
    block = cst.ensure_type(cst.parse_statement("with roundpipe.OptimizerCtx():\n    pass\n"), cst.With)
    return [block.with_changes(leading_lines=leading, body=block.body.with_changes(body=body))]


def roles_of(facts: ModuleFacts, function: cst.FunctionDef) -> HelperRoles:
    """The models and parameter iterables ``function`` is handed (see :class:`HelperRoles`)."""
    params = {p.name.value for p in function.params.params}
    models: List[str] = []
    for call in facts.subtree(function, cst.Call):
        func = call.func
        if isinstance(func, cst.Attribute) and func.attr.value in _WALKS:
            owner = dotted(func.value)
            if owner is not None and (owner in params or _self_attribute(owner)) and owner not in models:
                models.append(owner)
    iterables: List[str] = []
    for loop in _loops(facts, function):
        if isinstance(loop.iter, cst.Name) and loop.iter.value in params and loop.iter.value not in iterables:
            iterables.append(loop.iter.value)
    for call in facts.subtree(function, cst.Call):
        if facts.calls_any(call, CLIP_FUNCTIONS) and call.args and isinstance(call.args[0].value, cst.Name):
            name = call.args[0].value.value
            if name in params and name not in iterables:
                iterables.append(name)
    return HelperRoles(tuple(models), tuple(n for n in iterables if n not in models))


# ------------------------------------------------------------------ the analysis
def _touch(facts: ModuleFacts, function: cst.FunctionDef, depth: int, seen: Set[int]) -> Optional[str]:
    """What ``function`` does besides gradient work, in words; None for none."""
    if id(function) in seen:
        return None
    seen.add(id(function))
    roles = roles_of(facts, function)
    walked = _walked_variables(facts, function, roles)
    names = _name_variables(facts, function, roles)
    for node in facts.subtree(function, (cst.Global, cst.Nonlocal)):
        return f"declares `{code(node).strip()}`"
    state = _module_state_read(facts, function)
    if state is not None:
        return f"reads the module-level `{state}`, which the step function could read late or on another thread"
    for name in facts.subtree(function, cst.Name):
        found = _name_use(facts, function, name, roles, walked, names)
        if found is not None:
            return found
    for target in _written_targets(facts, function):
        if isinstance(target, (cst.Tuple, cst.List)):
            continue  # its elements are listed on their own
        root = target
        while isinstance(root, (cst.Attribute, cst.Subscript)):
            if isinstance(root, cst.Attribute) and root.attr.value == "grad" and _root_in(root.value, walked):
                break
            root = root.value
        else:
            if not isinstance(target, cst.Name) and not _local(facts, function, root):
                return f"writes `{code(target)}`"
    for call in facts.subtree(function, cst.Call):
        found = _call_use(facts, function, call, depth, seen)
        if found is not None:
            return found
    return None


def _name_use(
    facts: ModuleFacts,
    function: cst.FunctionDef,
    name: cst.Name,
    roles: HelperRoles,
    walked: Set[str],
    names: Set[str],
) -> Optional[str]:
    parent = facts.parent(name)
    value = name.value
    if value in roles.models and not _is_walk(facts, name):
        if isinstance(parent, cst.Param) or isinstance(parent, cst.Attribute) and parent.attr is name:
            return None
        used = code(facts.statement_of(name)).strip().splitlines()[0]
        return f"uses the model (`{used}`) otherwise than walking its parameters"
    if value == "self" and isinstance(parent, cst.Attribute) and parent.value is name:
        outer = facts.parent(parent)
        chain = f"self.{parent.attr.value}"
        if chain in roles.models and not (isinstance(outer, cst.Attribute) and _walked_at(facts, outer)):
            return f"reads `{code(outer if isinstance(outer, cst.Attribute) else parent)}` of the model"
    if value in walked and not (isinstance(parent, cst.Attribute) and parent.attr is name):
        if _grad_or_metadata(facts, name) or _loop_target(facts, name):
            return None
        return f"reads the weights (`{code(parent if parent is not None else name)}`), not only their gradients"
    if value in names and not _loop_target(facts, name) and not _safe_name_test(facts, name):
        return (
            f"reads the parameter names (`{code(parent if parent is not None else name)}`), which the optimizer "
            f"copies spell with a `{_PREFIX}` prefix"
        )
    return None


def _call_use(
    facts: ModuleFacts, function: cst.FunctionDef, call: cst.Call, depth: int, seen: Set[int]
) -> Optional[str]:
    func = call.func
    if isinstance(func, cst.Name):
        if func.value == "print":
            return "prints (output the optimizer thread would make)"
        inner = called_function(facts, call)
        if inner is not None:
            found = _touch(facts, inner, depth - 1, seen) if depth > 1 else "calls helpers too deep to follow"
            return None if found is None else f"calls {inner.name.value}(), which {found}"
        shadowed = _local(facts, function, func) or _is_parameter(function, func.value)
        if not shadowed and (func.value in _BUILTINS or _raised_builtin(facts, call)):
            return None
        if any(q.startswith("torch.") for q in facts.qualified(func)):
            return None
        return f"calls `{func.value}()`, which the migration does not follow"
    if isinstance(func, cst.Attribute):
        if any(q.startswith("torch.") for q in facts.qualified(func)):
            return None
        root = func.value
        while isinstance(root, (cst.Attribute, cst.Subscript, cst.Call)):
            root = root.func if isinstance(root, cst.Call) else root.value
        if isinstance(root, cst.Name) and root.value == "self":
            if func.attr.value in _WALKS:
                return None
            inner = called_function(facts, call)
            if inner is None:
                return f"calls `{code(func)}()`"
            found = _touch(facts, inner, depth - 1, seen) if depth > 1 else "calls helpers too deep to follow"
            return None if found is None else f"calls {code(func)}(), which {found}"
        if isinstance(root, cst.Name) and (
            _local(facts, function, root) or _is_parameter(function, root.value) or _loop_bound(facts, function, root)
        ):
            return None  # a method of its own values (`norms.append`, `p.grad.mul_`)
        if isinstance(root, (cst.SimpleString, cst.Integer, cst.Float, cst.List, cst.Tuple)):
            return None
        return f"calls `{code(func)}()`, which the migration does not follow"
    return None


def _module_state_read(facts: ModuleFacts, function: cst.FunctionDef) -> Optional[str]:
    """The first module-level variable ``function`` reads: a name the module binds otherwise
    than by ``def``, ``class``, an import or one assignment of a number, text or constant."""
    module_scope = facts.scope(facts.module)
    if module_scope is None:
        return None
    named_here = {node.value for node in facts.subtree(function, cst.Name)}  # no other name is read in it
    for name in sorted({a.name for a in module_scope.assignments} & named_here):
        bindings = list(module_scope.assignments[name])
        if all(_fixed_binding(facts, a, len(bindings)) for a in bindings):
            continue
        if any(facts.within(read, function) for read in facts.accesses(name, module_scope)):
            return name
    return None


def _fixed_binding(facts: ModuleFacts, binding: object, count: int) -> bool:
    node = getattr(binding, "node", None)
    if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Import, cst.ImportFrom)):
        return True
    target = facts.parent(node) if isinstance(node, cst.Name) else None
    assign = facts.parent(target) if isinstance(target, cst.AssignTarget) else None
    return (
        count == 1
        and isinstance(assign, cst.Assign)
        and isinstance(assign.value, (cst.Integer, cst.Float, cst.SimpleString, cst.Name, cst.UnaryOperation))
        and (not isinstance(assign.value, cst.Name) or assign.value.value in ("None", "True", "False"))
    )


def _library_dispatch_mode(facts: ModuleFacts, call: cst.Call) -> Optional[str]:
    """For a call of timm's ``dispatch_clip_grad``: its mode (``'norm'``, ``'value'`` when
    written as such a text, its code otherwise; ``'norm'`` when not given); else None."""
    if not facts.calls_any(call, set(_LIBRARY_DISPATCH)):
        return None
    keyword = [a.value for a in call.args if a.keyword is not None and a.keyword.value == "mode"]
    positional = [a.value for a in call.args if a.keyword is None and not a.star]
    mode = keyword[0] if keyword else positional[2] if len(positional) > 2 else None
    if mode is None:
        return "'norm'"
    text = mode.evaluated_value if isinstance(mode, cst.SimpleString) else None
    return repr(text) if isinstance(text, str) and repr(text) in _FIXED_MODES else code(mode)


def _raised_builtin(facts: ModuleFacts, call: cst.Call) -> bool:
    """``raise ValueError(...)``: a builtin exception built to be raised."""
    built = getattr(builtins, dotted(call.func) or "", None)
    return isinstance(built, type) and issubclass(built, BaseException) and isinstance(facts.parent(call), cst.Raise)


def _walked_variables(facts: ModuleFacts, function: cst.FunctionDef, roles: HelperRoles) -> Set[str]:
    """Loop variables bound to the walked parameters (``p`` of ``for p in
    model.parameters()``, of ``for name, p in model.named_parameters()``, of ``for p in
    parameters``)."""
    found: Set[str] = set()
    for loop in _loops(facts, function):
        source = _walk_source(loop.iter, roles)
        if source == "parameters" and isinstance(loop.target, cst.Name):
            found.add(loop.target.value)
        if source == "named_parameters" and isinstance(loop.target, cst.Tuple) and len(loop.target.elements) == 2:
            last = loop.target.elements[1].value
            if isinstance(last, cst.Name):
                found.add(last.value)
    return found


def _name_variables(facts: ModuleFacts, function: cst.FunctionDef, roles: HelperRoles) -> Set[str]:
    found: Set[str] = set()
    for loop in _loops(facts, function):
        if _walk_source(loop.iter, roles) == "named_parameters" and isinstance(loop.target, cst.Tuple):
            first = loop.target.elements[0].value
            if isinstance(first, cst.Name):
                found.add(first.value)
    return found


def _walk_source(iterated: cst.BaseExpression, roles: HelperRoles) -> Optional[str]:
    if isinstance(iterated, cst.Name) and iterated.value in roles.iterables:
        return "parameters"
    if isinstance(iterated, cst.Call) and isinstance(iterated.func, cst.Attribute) and not iterated.args:
        if dotted(iterated.func.value) in roles.models and iterated.func.attr.value in _WALKS:
            return iterated.func.attr.value
    return None


def _is_walk(facts: ModuleFacts, name: cst.Name) -> bool:
    """``name.parameters()``/``name.named_parameters()`` walked (:func:`_walked_at`)."""
    parent = facts.parent(name)
    return isinstance(parent, cst.Attribute) and parent.value is name and _walked_at(facts, parent)


def _walked_at(facts: ModuleFacts, walk: cst.Attribute) -> bool:
    """``walk`` (``x.parameters``) is called without arguments and the result iterated by a
    loop or comprehension, or handed to a clip function or a function of the module: never
    counted or indexed (the copies exist only for the parameters that require gradients)."""
    call = facts.parent(walk)
    if walk.attr.value not in _WALKS or not isinstance(call, cst.Call) or call.func is not walk or call.args:
        return False
    holder = facts.parent(call)
    if isinstance(holder, _LOOPS):
        return holder.iter is call
    user = facts.parent(holder) if isinstance(holder, cst.Arg) else None
    return isinstance(user, cst.Call) and (
        facts.calls_any(user, CLIP_FUNCTIONS) or called_function(facts, user) is not None
    )


def _grad_or_metadata(facts: ModuleFacts, name: cst.Name) -> bool:
    parent = facts.parent(name)
    return isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value in _METADATA | {"grad"}


def _loop_target(facts: ModuleFacts, name: cst.Name) -> bool:
    return any(isinstance(a, _LOOPS) and facts.within(name, a.target) for a in facts.ancestors(name))


def _loops(facts: ModuleFacts, function: cst.FunctionDef) -> List[Union[cst.For, cst.CompFor]]:
    """The loops and comprehension clauses of ``function``."""
    return [*facts.subtree(function, cst.For), *facts.subtree(function, cst.CompFor)]


def _loop_bound(facts: ModuleFacts, function: cst.FunctionDef, name: cst.Name) -> bool:
    """``name`` is bound by a loop or comprehension target of ``function``."""
    return any(
        isinstance(n, cst.Name) and n.value == name.value
        for loop in _loops(facts, function)
        for n in facts.subtree(loop.target, cst.Name)
    )


def _safe_name_test(facts: ModuleFacts, name: cst.Name) -> bool:
    """``"text" in name`` (a text that cannot reach into the copies' ``model.`` prefix) or
    ``name.endswith(...)``."""
    parent = facts.parent(name)
    if isinstance(parent, cst.Attribute) and parent.value is name and parent.attr.value == "endswith":
        return True
    target = facts.parent(parent) if isinstance(parent, cst.ComparisonTarget) else None
    if not (isinstance(parent, cst.ComparisonTarget) and isinstance(target, cst.Comparison)):
        return False
    if not isinstance(parent.operator, (cst.In, cst.NotIn)) or not isinstance(target.left, cst.SimpleString):
        return False
    text = target.left.evaluated_value
    return isinstance(text, str) and bool(text) and not any(text.startswith(_PREFIX[i:]) for i in range(len(_PREFIX)))


def _written_targets(facts: ModuleFacts, function: cst.FunctionDef) -> List[cst.BaseExpression]:
    targets: List[cst.BaseExpression] = [t.target for t in facts.subtree(function, cst.AssignTarget)]
    targets += [a.target for a in facts.subtree(function, cst.AugAssign)]
    targets += [a.target for a in facts.subtree(function, cst.AnnAssign)]
    targets += [d.target for d in facts.subtree(function, cst.Del)]
    unpacked = [e.value for t in targets if isinstance(t, (cst.Tuple, cst.List)) for e in t.elements]
    return targets + unpacked


def _root_in(node: cst.BaseExpression, names: Set[str]) -> bool:
    return isinstance(node, cst.Name) and node.value in names


def _local(facts: ModuleFacts, function: cst.FunctionDef, node: cst.BaseExpression) -> bool:
    """``node`` is a name the function binds itself (not one of its parameters)."""
    if not isinstance(node, cst.Name):
        return False
    scope = facts.scope(function.body)
    if scope is None or node.value not in scope.assignments:
        return False
    return all(
        isinstance(a, Assignment) and not isinstance(a.node, cst.Param) and facts.within(a.node, function)
        for a in scope.assignments[node.value]
    )


def _is_parameter(function: cst.FunctionDef, name: str) -> bool:
    return any(p.name.value == name for p in function.params.params)


def _self_attribute(owner: str) -> bool:
    return owner.startswith("self.") and owner.count(".") == 1


def _is_method(facts: ModuleFacts, function: cst.FunctionDef) -> bool:
    return isinstance(facts.parent(facts.parent(function)), cst.ClassDef)


def _gradient_helper(step: "StepBuilder", call: cst.Call) -> Optional[Tuple[ModuleFacts, cst.FunctionDef]]:
    """The function ``call`` runs, of this module or of another given file
    (:mod:`migrate.foreign_functions`), with the metadata of its module, when it walks the
    parameters of what it is handed and works on gradients (reads ``.grad`` or clips);
    else None."""
    facts, function = step.facts, called_function(step.facts, call)
    if function is None:
        foreign = imported_function(step.facts, step.rules.foreign, call)
        if foreign is None:
            return None
        facts, function = foreign.facts, foreign.function
    return (facts, function) if walks_gradients(facts, function) else None


def is_gradient_only(facts: ModuleFacts, function: cst.FunctionDef) -> bool:
    """``function`` (of the module ``facts`` describes) is a gradient helper doing nothing
    but gradient work (see the module's contract)."""
    return walks_gradients(facts, function) and _touch(facts, function, DEPTH, set()) is None


def walks_gradients(facts: ModuleFacts, function: cst.FunctionDef) -> bool:
    """``function`` walks the parameters of what it is handed and reads ``.grad`` or clips."""
    roles = roles_of(facts, function)
    if not roles.models and not roles.iterables:
        return False
    grads = any(a.attr.value == "grad" for a in facts.subtree(function, cst.Attribute))
    return grads or any(facts.calls_any(c, CLIP_FUNCTIONS) for c in facts.subtree(function, cst.Call))


def _after_a_step(facts: ModuleFacts, statement: cst.BaseStatement) -> bool:
    """A ``x.step(...)`` or ``x.update(...)`` line comes before ``statement`` in its block or
    in a block around it (in the same function): a helper there reads what the step left,
    which is judged as a read after the step (RPM140), not moved into it."""
    node: cst.CSTNode = statement
    while not isinstance(node, (cst.FunctionDef, cst.Module)):
        block = facts.parent(node)
        body: List[cst.CSTNode] = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
        if node in body:
            earlier = [s for s in body[: body.index(node)] if isinstance(s, cst.BaseStatement)]
            if any(_steps(s) for s in earlier):
                return True
        if block is None:
            return False
        node = block
    return False


def _steps(statement: cst.BaseStatement) -> bool:
    value = only_expression(statement)
    return m.matches(value, m.Call(func=m.Attribute(attr=m.Name("step") | m.Name("update")))) if value else False


def _helper_call(statement: cst.BaseStatement) -> Tuple[Optional[cst.Call], str]:
    value = only_expression(statement)
    if isinstance(value, cst.Call):
        return value, "clip"
    assign = only_assignment(statement)
    if (
        assign is not None
        and isinstance(assign.value, cst.Call)
        and all(isinstance(t.target, cst.Name) for t in assign.targets)
    ):
        return assign.value, "measure"
    return None, "clip"


def _parameters_of(value: cst.BaseExpression, model: str) -> bool:
    return (
        m.matches(value, PARAMETERS_CALL)
        and isinstance(value, cst.Call)
        and dotted(value.func) == f"{model}.parameters"
    )


def _refuse_handed(call: cst.Call, function: cst.FunctionDef, name: str, model: str) -> None:
    raise Blocked(
        call,
        CODE,
        f"{function.name.value}() walks the parameters of its `{name}`, which this call does not hand "
        f"as the trained model {model!r} (or `{model}.parameters()`); not migrated",
    )


def _model_spellings(step: "StepBuilder", call: cst.Call, model: str) -> Set[str]:
    """``model`` and the locals of the function around ``call`` bound once to it
    (``model = self.model``: :func:`~migrate.attribute_aliases.local_aliases`)."""
    return {model, *local_aliases(step.rules, call, model)}


def _refuse_rebound_arguments(
    step: "StepBuilder", call: cst.Call, function: cst.FunctionDef, spellings: Set[str]
) -> None:
    """In the asynchronous form the step function runs after the main thread has gone on:
    an argument naming a variable the enclosing function rebinds (a loop variable; not the
    model, spelled one of ``spellings``) would be read late."""
    facts = step.facts
    scope = facts.scope(call)
    if scope is None:
        return
    models = {spelled.split(".")[0] for spelled in spellings}
    for name in facts.subtree(call, cst.Name):
        if name is call.func or name.value in models or name.value not in scope.assignments:
            continue
        parent = facts.parent(name)
        if isinstance(parent, cst.Attribute) and parent.attr is name:
            continue
        if any(
            not isinstance(a, Assignment) or not isinstance(a.node, cst.Param) for a in scope.assignments[name.value]
        ):
            raise Blocked(
                call,
                CODE,
                f"{function.name.value}() is handed `{name.value}`, which the enclosing function rebinds: "
                "the asynchronous step function would read it late (use --exact, or pass a value "
                "fixed for the step)",
            )
