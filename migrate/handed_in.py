"""Objects a trainer class is handed through its constructor: ``Trainer(model, optimizer)``.

detectron2-, MMEngine- and Hugging Face-style trainers are given the model and the optimizer
the caller built (``self.model = model`` in ``__init__``). Such an attribute holds what every
construction of the class in the module passes for that parameter, so its origins are
those arguments' origins (:func:`migrate.origins.origins` follows them like a function's
parameter): the model is wrapped, and the optimizer built on its copies, where the caller
builds them, and the trainer's step sees that model as ``self.model``.

Followed only when the module shows every construction: the parameter is read once in
``__init__``, by the attribute's one binding ``self.x = param``; the classes are called by
their names only (no alias, no other use of a name but as a base), a subclass handing the
value on through ``super().__init__(...)`` (:mod:`migrate.inherited_init`); and every
construction passes the parameter as a plain name or a call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

import libcst as cst
import libcst.matchers as m

from .attributes import InstanceFamily, wrapped
from .inherited_init import ForwardBlocked, forwarding_reads, handed_arguments
from .origins import constructor_parameter, origins
from .plan import Binding, Blocked, Plan
from .syntax import code, only_expression

if TYPE_CHECKING:
    from .names import ModuleFacts
    from .steps import StepBuilder
    from .torch_amp import TorchAmpRules

__all__ = [
    "attribute_fed",
    "constructed_init",
    "handed_model",
    "note_handed",
    "plan_handed_wrap",
]

_CODE = "RPM108"
#: torch's data-parallel wrappers: a RoundPipe model is neither.
_PARALLEL = {
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.data_parallel.DataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
}


def _check_only_binding(facts: "ModuleFacts", binding: Binding, rewritten: Sequence[cst.Call] = ()) -> None:
    """The model's parameter is read in ``__init__`` (and, where subclasses hand it on, in
    theirs) by its attribute's binding and the forwards only, besides mode switches
    (``model.train()``), ``isinstance`` tests, which mean the same for the wrapped
    model, and the ``model.parameters()`` calls of ``rewritten`` (the optimizer's, built on
    the copies); any other use (``self.ema = copy.deepcopy(model)``) would hold the model
    unfollowed."""
    value = binding.value
    scope = facts.scope(value) if isinstance(value, cst.Name) else None
    reads = facts.accesses(value.value, scope) if isinstance(value, cst.Name) and scope is not None else []
    handed = constructor_parameter(facts, binding)
    if handed is not None:
        reads = [*reads, *forwarding_reads(facts, binding.scope, *handed)]  # type: ignore[arg-type]
    optimized = [call.func.value for call in rewritten if isinstance(call.func, cst.Attribute)]
    other = next(
        (
            read
            for read in reads
            if read is not value and not _same_when_wrapped(facts, read) and all(read is not o for o in optimized)
        ),
        None,
    )
    if other is not None:
        raise Blocked(
            other,
            _CODE,
            f"`{code(facts.statement_of(other)).strip().splitlines()[0]}` uses `{code(other)}`, the model "
            f"handed to the constructor, besides `{binding.name} = {code(other)}`; the object it holds cannot be "
            "followed; left untouched",
        )


def _same_when_wrapped(facts: "ModuleFacts", read: cst.Name) -> bool:
    """``read`` is ``model`` in a statement ``model.train()``/``model.eval()``, in a test
    ``isinstance(model, DistributedDataParallel)`` (or ``DataParallel``, or a tuple of
    them), or in the body of an ``if`` with that test: the same for the RoundPipe-wrapped
    model, which is neither (detectron2's AMPTrainer asserts it)."""
    parent = facts.parent(read)
    if isinstance(parent, cst.Arg):
        return _parallel_test(facts, facts.parent(parent), read)
    if any(isinstance(a, cst.If) and _parallel_test(facts, a.test, None) for a in facts.ancestors(read)):
        return True
    call = facts.parent(parent) if parent is not None else None
    return (
        isinstance(parent, cst.Attribute)
        and parent.attr.value in ("train", "eval")
        and isinstance(call, cst.Call)
        and only_expression(facts.statement_of(read)) is call
    )


def _parallel_test(facts: "ModuleFacts", node: Optional[cst.CSTNode], tested: Optional[cst.Name]) -> bool:
    """``node`` is ``isinstance(x, <torch's data-parallel wrappers>)`` (of ``tested`` when given)."""
    if not (isinstance(node, cst.Call) and m.matches(node.func, m.Name("isinstance")) and len(node.args) == 2):
        return False
    if tested is not None and node.args[0].value is not tested:
        return False
    kinds = node.args[1].value
    classes = [e.value for e in kinds.elements] if isinstance(kinds, cst.Tuple) else [kinds]
    return all(facts.qualified(c) and facts.qualified(c) <= _PARALLEL for c in classes)


def attribute_fed(
    rules: "TorchAmpRules", at: cst.CSTNode, name: str, scope: object
) -> Optional[Tuple[str, cst.FunctionDef]]:
    """The instance attribute (``self.model``, spelled as in the method around ``at``)
    handed what ``name`` of ``scope`` holds at every construction, with the ``__init__``
    that binds it; None when none is. Raises the first :class:`ForwardBlocked` met when
    none is: a subclass's ``super().__init__(...)`` that may hand the base that object."""
    facts = rules.facts
    method = None
    for ancestor in facts.ancestors(at):
        if isinstance(ancestor, cst.FunctionDef) and rules.attributes.receiver_of(ancestor) is not None:
            method = ancestor
            break
    receiver = rules.attributes.receiver_of(method) if method is not None else None
    if method is None or receiver is None or not method.params.params:
        return None
    family = _family_of_method(rules, method)
    if family is None:
        return None
    forward: Optional[ForwardBlocked] = None
    for init in (method for method in family.methods if method.name.value == "__init__"):
        for statement in init.body.body:
            target = _attribute_target(statement)
            if target is None:
                continue
            try:
                reached = origins(rules, f"{family.methods[init]}.{target}", statement)
            except ForwardBlocked as blocked:
                forward = forward or blocked
                continue
            except Blocked:
                continue
            if any(o.name == name and o.scope is scope for o in reached):
                return f"{receiver}.{target}", init
    if forward is not None:
        raise forward  # a subclass hands the base something the migration cannot follow
    return None


def _family_of_method(rules: "TorchAmpRules", method: cst.FunctionDef) -> Optional[InstanceFamily]:
    receiver = rules.attributes.receiver_of(method)
    if receiver is None:
        return None
    for node in rules.facts.subtree(method.body, cst.Attribute):
        if isinstance(node.value, cst.Name) and node.value.value == receiver:
            return rules.attributes.family_of_attribute(node)
    return None


def _attribute_target(statement: cst.CSTNode) -> Optional[str]:
    """``x`` of a line ``self.x = <name>``."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if not isinstance(small, cst.Assign) or len(small.targets) != 1 or not isinstance(small.value, cst.Name):
        return None
    target = small.targets[0].target
    return target.attr.value if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) else None


def handed_model(step: "StepBuilder", model: str, built: Binding) -> Optional[str]:
    """For a step in a method of a trainer class whose optimizer is built outside it (on
    ``model`` of ``built``'s scope): the attribute every construction hands that model
    (``self.model``), registered as wrapped; None for a step outside a class. Raises
    :class:`Blocked` when no attribute holds it (the step would step another model)."""
    method = step.facts.enclosing(step.backward, (cst.FunctionDef,))
    if not isinstance(method, cst.FunctionDef) or step.rules.attributes.receiver_of(method) is None:
        return None
    family = _family_of_method(step.rules, method)
    fed = attribute_fed(step.rules, step.backward, model, built.scope)
    if family is None or fed is None:
        raise Blocked(
            built.statement or step.backward,
            _CODE,
            f"the optimizer is built on {model!r} outside the class whose method steps it, and no "
            "attribute of the class is handed that model at every construction; left untouched",
        )
    attribute, init = fed
    _check_only_binding(step.facts, step.rules.attributes.binding(attribute, step.backward))
    step.rules.plan.wrapped_models.append((family, attribute, 0))
    note_handed(step.rules.plan, family, step.backward, init, f"steps the model ({attribute})")
    return attribute


def note_handed(plan: Plan, family: InstanceFamily, node: cst.CSTNode, init: cst.FunctionDef, what: str) -> None:
    """Report, at ``node``, an object followed through the constructor ``init`` of a class
    of ``family``, and record every class of the family in ``plan.handed_classes`` (a
    subclass's constructions run the base's ``__init__`` too; the file's result carries the
    names, and the project layer looks for constructions of those classes in other files).
    The report line names them all (``SimpleTrainer/AMPTrainer``)."""
    facts = family.facts
    block = facts.parent(init)
    owner = facts.parent(block) if block is not None else None
    first = owner.name.value if isinstance(owner, cst.ClassDef) else init.name.value
    names = [first, *(cls.name.value for cls in family.classes if cls is not owner)]
    plan.rewrites.append((node, f"{what} handed to {'/'.join(names)}() at each of its constructions here"))
    plan.handed_classes.update(names)


def constructed_init(facts: "ModuleFacts", call: cst.CSTNode) -> Optional[cst.FunctionDef]:
    """The ``__init__`` of the module's class that ``call`` (``Class(...)``) builds, else None."""
    if not isinstance(call, cst.Call) or not isinstance(call.func, cst.Name):
        return None
    scope = facts.scope(call)
    for assignment in scope[call.func.value] if scope is not None else ():
        cls = getattr(assignment, "node", None)
        if isinstance(cls, cst.ClassDef):
            return next(
                (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
            )
    return None


def plan_handed_wrap(step: "StepBuilder", built: Binding, model: str, parameter_calls: List[cst.Call]) -> bool:
    """For an optimizer a trainer builds on ``self.model.parameters()`` (anywhere in the
    class, lazily too) where ``self.model`` is handed to the constructor: the model is
    wrapped where each construction hands it (``model = roundpipe.RoundPipe(model, ...)``
    right before ``Trainer(model, ...)``, or the argument itself when it is a call) and the
    optimizer built on ``self.model.optim_parameters()``; True when planned, False when the
    model attribute is not handed in (the rules wrap it in ``__init__``)."""
    family = built.scope
    if not isinstance(family, InstanceFamily) or "." not in model:
        return False
    rules, facts = step.rules, step.facts
    model_binding = rules.attributes.binding(model, built.statement or step.backward)
    handed = constructor_parameter(facts, model_binding)
    if handed is None:
        return False
    init, param = handed
    _check_only_binding(facts, model_binding, parameter_calls)
    plan = rules.plan
    for call in parameter_calls:
        plan.edits.replace_expression(
            call.func, lambda updated: updated.with_changes(attr=cst.Name("optim_parameters"))
        )
    if id(built.statement) in plan.wrapped_optimizers:
        return True
    plan.wrapped_optimizers.add(id(built.statement))
    config = f"model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch={plan.microbatch})"
    for site, passed in handed_arguments(facts, family, init, param):
        statement = facts.statement_of(site)
        block = facts.parent(statement)
        if isinstance(passed, cst.Call):
            template = f"roundpipe.RoundPipe(_, {config})"
            plan.edits.replace_expression(passed, lambda updated: wrapped(template, updated))
        elif isinstance(passed, cst.Name) and isinstance(block, (cst.IndentedBlock, cst.Module)):
            wrap = cst.parse_statement(f"{passed.value} = roundpipe.RoundPipe({passed.value}, {config})\n")
            plan.edits.insert_before(block, list(block.body).index(statement), [wrap])
            plan.wrapped_models.append((facts.scope(site), passed.value, facts.order(statement)))
        else:
            raise Blocked(
                site, _CODE, f"`{code(site)}` hands the model to {family.name}() other than by a name or a call"
            )
        note_handed(plan, family, statement, init, "wrapped with roundpipe.RoundPipe: the model")
    plan.wrapped_models.append((family, model, 0))
    return True
