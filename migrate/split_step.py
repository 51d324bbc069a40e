"""A trainer's step split over methods: the backward in one, the optimizer work in another.

Trainers built from mixins (detectron2's and MMEngine's style) or Hugging Face-style
trainers call ``self.backward(loss)`` (a method ending with
``self.scaler.scale(loss).backward()``) and then ``self.optimizer_step()`` (a method
holding ``unscale_``/clipping/``scaler.step``/``update``/``zero_grad``). Such a step takes
the autograd form (design/MIGRATE.md, "Two target forms"): the backward stays as written,
since RoundPipe's forward is differentiable and its backward accumulates the gradients, and
only the optimizer method's step group becomes ``self.model.step(_step_fn)`` +
``self.scaler.update()``. Nothing depends on where the backward ran, so the methods may be
called in any order, from anywhere.

What makes it certain: the scaler is an instance attribute followed through the class and
its bases and subclasses in the file (:mod:`migrate.attributes`); its one ``scaler.step``
is in a method of that family other than the backward's; that method's step statements form
one recognised group; and no ``zero_grad`` of the optimizer or the model runs outside the
group (in the original it empties gradients between backward and step, which the step
function cannot reproduce).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Iterable, List, Optional

import libcst as cst

from .attributes import InstanceFamily
from .plan import Blocked
from .syntax import calls_method, code, only_expression

if TYPE_CHECKING:
    from .recognised import RecognisedStep
    from .steps import StepBuilder, StepGroup
    from .torch_amp import TorchAmpRules

__all__ = ["calls_own_method", "detached_group", "planned_already", "plan_detached", "refuse_zero_grad_outside"]


def detached_group(step: "StepBuilder") -> Optional["StepGroup"]:
    """The step group of the family method that steps ``step``'s scaler, when the backward
    ends its own method and that one holds no step; else None (nothing recognised)."""
    family = _family(step)
    backward_method = family.method_of(step.backward) if family is not None else None
    if family is None or backward_method is None or not step.ends_function(backward_method):
        return None
    stepping = _step_calls(step, family)
    methods = {family.method_of(call) for call in stepping}
    if len(stepping) != 1 or None in methods or backward_method in methods:
        return None
    method = methods.pop()
    assert method is not None
    found, _ = step.step_group_after(method.body, list(method.body.body), -1)  # type: ignore[arg-type]
    if found is None or not any(step.facts.within(stepping[0], s) for s in found.statements):
        return None
    return found


def planned_already(step: "StepBuilder", found: "StepGroup") -> bool:
    """Another backward of the same family already planned this step group (two methods
    each ending with a backward, one optimizer method): nothing more to do but say so."""
    if found.statements[0] not in step.rules.plan.step_statements or step.facts.within(step.backward, found.block):
        return False
    step.rules.plan.rewrites.append((step.backward, "backward kept (autograd form): its step is planned already"))
    return True


def plan_detached(step: "StepBuilder", recognised: "RecognisedStep") -> bool:
    """Plan ``recognised`` as the autograd form of a split step when its group is not in the
    backward's method (True); False for an ordinary step. Raises :class:`Blocked` (RPM106)
    for a ``zero_grad`` of the optimizer or the model outside the group."""
    found, optimizer, model = recognised.group, recognised.optimizer, recognised.model
    family = _family(step)
    method = family.method_of(found.block) if family is not None else None
    if family is None or method is None or method is family.method_of(step.backward):
        return False
    outside = f"the optimizer method of a step split over methods of {family.name}"
    refuse_zero_grad_outside(step, found, family.classes, outside, owners=(optimizer, model))
    owner = step.facts.parent(step.facts.parent(method))
    where = f"{owner.name.value}.{method.name.value}()" if isinstance(owner, cst.ClassDef) else family.name
    unfused = Blocked(
        step.backward,
        "RPM106",
        f"the optimizer step is in another method ({where}); the backward stays where it is",
    )
    step.plan_autograd_form(recognised, unfused)
    return True


def _family(step: "StepBuilder") -> Optional[InstanceFamily]:
    call = only_expression(step.backward)
    scale = call.func.value if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) else None
    scaler = scale.func.value if isinstance(scale, cst.Call) and isinstance(scale.func, cst.Attribute) else None
    if not isinstance(scaler, cst.Attribute) or "." not in step.scaler:
        return None
    return step.rules.attributes.family_of_attribute(scaler)


def _step_calls(step: "StepBuilder", family: InstanceFamily) -> List[cst.Call]:
    """The ``scaler.step(...)`` calls on the step's scaler in the family's methods."""
    attr = step.scaler.partition(".")[2]
    reads = family.follow(attr).reads
    calls = [step.facts.parent(step.facts.parent(read)) for read in reads]
    return [c for c in calls if isinstance(c, cst.Call) and calls_method(c, "step")]


def refuse_zero_grad_outside(
    step: "StepBuilder",
    found: "StepGroup",
    roots: Iterable[cst.CSTNode],
    outside: str,
    owners: Optional[Collection[Optional[str]]] = None,
) -> None:
    """Raise :class:`Blocked` (RPM106) at the first ``zero_grad`` call under ``roots`` that
    is not in ``found``'s statements (with ``owners``: only one called on one of those
    names, by :meth:`~migrate.torch_amp.TorchAmpRules.reference`). In the original it
    empties gradients between the backward and the step of a split step, which the step
    function cannot reproduce; ``outside`` names the place the message says it is outside of."""
    for root in roots:
        for call in step.facts.subtree(root, cst.Call):
            if not calls_method(call, "zero_grad") or any(step.facts.within(call, s) for s in found.statements):
                continue
            if owners is not None and step.rules.reference(call.func.value) not in owners:  # type: ignore[attr-defined]
                continue
            raise Blocked(
                call,
                "RPM106",
                f"`{code(call)}` empties gradients outside {outside}; the step function cannot keep it in "
                "its place; left untouched",
            )


def calls_own_method(step_rules: "TorchAmpRules", call: cst.Call) -> bool:
    """``self.backward(loss)``: a call of a method that the instance's family defines (the
    mixin's ``backward``), not a tensor's backward; the backwards in that method are
    checked where they are."""
    func = call.func
    family = step_rules.attributes.family_of_attribute(func) if isinstance(func, cst.Attribute) else None
    return family is not None and any(m.name.value == func.attr.value for m in family.methods)  # type: ignore[attr-defined]
