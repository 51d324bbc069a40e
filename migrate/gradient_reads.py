"""Gradients read on the main thread after a migrated step.

``model.step`` hands the model's gradients over to the optimizer copies, so after it the
model's parameters hold none, and the optimizer copies' gradients belong to the optimizer
thread. A ``.grad`` read that the original made after ``optimizer.step()`` (a gradient norm
or histogram logged after the step, before the next ``zero_grad``) would see other values
(RPM140). Reads between a backward and its step keep working (the gradients are still on the
model), as do reads in statements that move into the step function.

The functions holding a migrated step are looked at, and so are their callers in the file
(``loss = train_step(model, ...)`` then ``p.grad.norm()``), and theirs: a read after such a
call, or in a loop around it, counts as after the step. So does a helper of the file
called there that reads gradients inside itself (``log_grads(model)``, followed a few
calls deep: :mod:`migrate.helper_reads`); the report is at the call and names the read.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Set, Union

import libcst as cst

from .helper_reads import gradient_read_in, is_gradient_read
from .names import ModuleFacts
from .plan import Blocked, Plan
from .syntax import code

__all__ = ["check_gradient_reads", "check_gradient_reads_after_call"]

Holder = Union[cst.FunctionDef, cst.Module]


def check_gradient_reads(facts: ModuleFacts, plan: Plan) -> None:
    """Raise :class:`Blocked` (RPM140) at the first ``.grad`` read that a function holding a
    migrated step makes after that step, outside the statements moved into it, or that a
    caller of such a function makes after the call (or in a loop around it)."""
    moved: Dict[int, List[int]] = {}  # id(holder) -> orders of the moved step statements
    holders: Dict[int, Holder] = {}
    for statement in plan.step_statements:
        holder = facts.enclosing(statement, (cst.FunctionDef,)) or facts.module
        holders[id(holder)] = holder
        moved.setdefault(id(holder), []).append(facts.order(statement))
    for key, holder in holders.items():
        backwards = sorted(
            facts.order(b) for b in plan.backward_statements if facts.within(b, holder) and b is not holder
        )
        for attribute in _grad_reads(facts, holder, plan):
            if _after_a_step(facts.order(attribute), backwards, moved[key]):
                _refuse(facts, attribute)
        for call in _helper_calls(facts, holder, plan):
            if _after_a_step(facts.order(call), backwards, moved[key]):
                _refuse_helper(facts, plan, call)
    for call in _calls_of_holders(facts, [h for h in holders.values() if isinstance(h, cst.FunctionDef)]):
        check_gradient_reads_after_call(facts, plan, call)


def check_gradient_reads_after_call(facts: ModuleFacts, plan: Plan, call: cst.Call) -> None:
    """Raise :class:`Blocked` (RPM140) at a ``.grad`` read that the function making ``call``
    (a call that runs a migrated step) makes after it, or in a loop around it (the next
    iteration reads what the step left)."""
    caller = facts.enclosing(call, (cst.FunctionDef,)) or facts.module
    loops = [a for a in facts.ancestors(call) if isinstance(a, (cst.For, cst.While)) and facts.within(a, caller)]
    own = caller if isinstance(caller, cst.FunctionDef) else None
    for attribute in _grad_reads(facts, caller, plan):
        if facts.enclosing(attribute, (cst.FunctionDef,)) is not own:
            continue  # a nested function's read: not made at this call
        if facts.order(attribute) > facts.order(call) or any(facts.within(attribute, loop) for loop in loops):
            _refuse(facts, attribute)
    for helper in _helper_calls(facts, caller, plan):
        if helper is call or facts.enclosing(helper, (cst.FunctionDef,)) is not own:
            continue
        if facts.order(helper) > facts.order(call) or any(facts.within(helper, loop) for loop in loops):
            _refuse_helper(facts, plan, helper)


def _grad_reads(facts: ModuleFacts, holder: Holder, plan: Plan) -> Iterator[cst.Attribute]:
    """The ``.grad`` reads under ``holder`` outside the statements moved into a step."""
    for attribute in facts.subtree(holder, cst.Attribute):
        if is_gradient_read(facts, attribute) and not any(facts.within(attribute, s) for s in plan.step_statements):
            yield attribute


def _helper_calls(facts: ModuleFacts, holder: Holder, plan: Plan) -> Iterator[cst.Call]:
    """The calls under ``holder``, outside the statements moved into a step, that run a
    helper of the file reading gradients."""
    for call in facts.subtree(holder, cst.Call):
        if any(facts.within(call, s) for s in plan.step_statements):
            continue
        if gradient_read_in(facts, plan, call) is not None:
            yield call


def _calls_of_holders(facts: ModuleFacts, holders: List[cst.FunctionDef]) -> List[cst.Call]:
    """The calls, in the file, of the functions in ``holders`` (``train_step(...)``, or
    ``self.train_step(...)`` in the method's class), and of the functions making such a call,
    outwards."""
    found: List[cst.Call] = []
    seen: Set[int] = set()
    pending = list(holders)
    while pending:
        holder = pending.pop()
        if id(holder) in seen:
            continue
        seen.add(id(holder))
        for call in facts.subtree(facts.module, cst.Call):
            if facts.within(call, holder) or not _calls(facts, call, holder):
                continue
            found.append(call)
            caller = facts.enclosing(call, (cst.FunctionDef,))
            if caller is not None:
                pending.append(caller)
    return found


def _calls(facts: ModuleFacts, call: cst.Call, function: cst.FunctionDef) -> bool:
    """``call`` calls ``function``: a function of the module by name, or a method of the
    enclosing class as ``self.name(...)``."""
    if facts.local_function(call) is function:
        return True
    func = call.func
    if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
        return False
    klass = facts.enclosing(call, (cst.ClassDef,))
    return func.attr.value == function.name.value and klass is not None and function in klass.body.body


def _refuse(facts: ModuleFacts, attribute: cst.Attribute) -> None:
    raise Blocked(
        attribute,
        "RPM140",
        f"`{code(facts.statement_of(attribute)).strip()}` reads gradients after the optimizer "
        "step; once migrated, model.step has handed them to the optimizer copies, so this "
        "would read other values; read them before the step, or migrate by hand",
    )


def _refuse_helper(facts: ModuleFacts, plan: Plan, call: cst.Call) -> None:
    read = gradient_read_in(facts, plan, call)
    assert read is not None
    raise Blocked(
        call,
        "RPM140",
        f"`{code(call.func)}(...)` reads gradients (`{code(facts.statement_of(read)).strip().splitlines()[0]}`, "
        f"line {facts.line(read)}) after the optimizer step; once migrated, model.step has handed them to "
        "the optimizer copies, so it would read other values; call it before the step, or migrate by hand",
    )


def _after_a_step(order: int, backwards: List[int], steps: List[int]) -> bool:
    """A read at ``order`` may see gradients a step has taken: a moved step statement comes
    between it and the latest backward before it (or, in a function with no backward, the
    function's start); in a function with backwards, a read before all of them (the next
    iteration of a loop) counts too."""
    earlier = [b for b in backwards if b < order]
    if not earlier:
        return bool(backwards) or any(s < order for s in steps)
    return any(earlier[-1] < s < order for s in steps)
