"""Main-thread statements that write (or read) optimizer state.

In the asynchronous RoundPipe form the step function runs on the optimizer thread while the
main thread goes on; a learning-rate loop over ``optimizer.param_groups``, a scheduler step
outside the step function, ``add_param_group`` or a helper handed the optimizer
(``adjust_learning_rate(optimizer, epoch)``) and a ``zero_grad()`` left beside the step
(it clears the optimizer copies' gradients) would race with it, and so would a read of what
the step writes in place (``optimizer.state_dict()``, ``optimizer.state[p]``, a scheduler's
``last_epoch``). The rules order each of them after the running step (``model.synchronize()``
before it); this module only finds them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Set

import libcst as cst
import libcst.matchers as m

from .names import LR_SCHEDULER_PREFIX, ModuleFacts
from .plan import Binding, Blocked
from .syntax import dotted, method_call

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["is_scheduler", "may_run_after", "optimizer_writes"]

#: Attributes of an optimizer holding what its step writes in place (a read races with it).
_STEPPED_STATE = ("param_groups", "state", "state_dict")


def is_scheduler(rules: "TorchAmpRules", name: str, at: cst.CSTNode, unbound: bool = False) -> bool:
    """``name`` (a name or ``self.attribute`` read at ``at``) holds a learning-rate scheduler:
    it is bound by a call of ``torch.optim.lr_scheduler`` or of a function of the module
    returning one, or it is named like one (``sched``
    in the name: a scheduler built by a helper, handed in as a parameter, or held in an
    attribute the rules do not follow). Raises :class:`Blocked` for a plain name that the
    file does not bind, unless ``unbound`` (then such a name, a global of another module, is
    judged by its name too)."""
    binding: Optional[Binding] = None
    try:
        binding = rules.binding(name, at)
    except Blocked:
        if "." not in name and not unbound:
            raise
    if binding is not None and isinstance(binding.value, cst.Call):
        if rules.facts.calls_prefix(binding.value, [LR_SCHEDULER_PREFIX]) or _returns_scheduler(
            rules.facts, binding.value
        ):
            return True
    return "sched" in name.lower()


def _returns_scheduler(facts: ModuleFacts, call: cst.Call) -> bool:
    """``call`` calls a function of this module whose every ``return`` builds a torch
    learning-rate scheduler (``return LambdaLR(optimizer, factor)``)."""
    function = facts.local_function(call)
    returns = [
        r
        for r in (facts.subtree(function, cst.Return) if function is not None else [])
        if facts.enclosing(r, (cst.FunctionDef,)) is function
    ]
    return bool(returns) and all(
        isinstance(r.value, cst.Call) and facts.calls_prefix(r.value, [LR_SCHEDULER_PREFIX]) for r in returns
    )


def optimizer_writes(
    facts: ModuleFacts,
    root: cst.CSTNode,
    optimizer: str,
    is_scheduler: Callable[[str, cst.CSTNode], bool],
    skipped: Set[cst.CSTNode],
    trainers: Set[str],
) -> List[cst.BaseStatement]:
    """Statements under ``root`` (not inside nested functions or classes, nor under the
    ``skipped`` nodes) that touch the state of ``optimizer`` (a name or ``self.optimizer``),
    in source order: the outermost
    ``for`` over ``optimizer.param_groups``, or the line that assigns into it, calls one of
    its mutating methods, steps a scheduler or passes the optimizer to a call (other than
    a call of one of the ``trainers``, the functions and methods holding the migrated steps
    or calling them with the optimizer), reads what the step writes in place
    (``optimizer.state_dict()``, ``optimizer.state[p]``), reads any attribute of its
    scheduler (``scheduler.get_last_lr()``, ``scheduler.last_epoch``: what the step
    function's ``scheduler.step()`` writes) or calls a method of an object built with the
    optimizer (``policy = WarmupPolicy(optimizer, ...)``; ``policy.step_update(n)`` writes
    its groups)."""
    found: List[cst.BaseStatement] = []

    def reads_param_groups(node: cst.CSTNode) -> bool:
        return any(
            attribute.attr.value == "param_groups" and dotted(attribute.value) == optimizer
            for attribute in facts.subtree(node, cst.Attribute)
        )

    def reads_stepped_state(line: cst.SimpleStatementLine) -> bool:
        for attribute in facts.subtree(line, cst.Attribute):
            owner = dotted(attribute.value)
            if owner == optimizer and attribute.attr.value in _STEPPED_STATE:
                return True
            if owner is not None and _reads_scheduler(is_scheduler, owner, line):
                return True
        return False

    def touches(line: cst.SimpleStatementLine) -> bool:
        if reads_stepped_state(line):
            return True
        for call in facts.subtree(line, cst.Call):
            if any(method_call(call, optimizer, name) for name in ("add_param_group", "load_state_dict", "zero_grad")):
                return True
            owner = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
            if owner is not None and call.func.attr.value == "step" and is_scheduler(owner, line):  # type: ignore[attr-defined]
                return True
            if owner is not None and _built_with(facts, owner, line, optimizer):
                return True
            if any(dotted(arg.value) == optimizer for arg in call.args) and _called_name(call) not in trainers:
                return True
            if _calls_a_schedule(facts, call, line, optimizer, is_scheduler, skipped):
                return True
        return False

    def visit(node: cst.CSTNode) -> bool:
        if node in skipped or (node is not root and isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda))):
            return False
        if isinstance(node, cst.For) and reads_param_groups(node.iter):
            found.append(node)
            return False
        if isinstance(node, cst.SimpleStatementLine):
            if touches(node):
                found.append(node)
            return False
        return True

    facts.walk(root, visit)
    return found


def _calls_a_schedule(
    facts: ModuleFacts,
    call: cst.Call,
    line: cst.CSTNode,
    optimizer: str,
    is_scheduler: Callable[[str, cst.CSTNode], bool],
    step: Set[cst.CSTNode],
) -> bool:
    """``call`` calls a name (not a function of this module) that may hold a schedule
    (``scheduler(step)``): built by a call given ``optimizer`` (OpenCLIP's ``cosine_lr(
    optimizer, ...)`` returns a closure writing every group's lr), a scheduler by its
    binding or its name, or a parameter handed in beside the optimizer (``lr_fn`` of
    ``train_one_epoch(model, optimizer, lr_fn)``: the caller, maybe in another file, may
    have built it with the optimizer, so it is taken for one, unless a call of it computes
    what a backward or the ``step``'s own statements read: the model, ``loss(**out)``)."""
    if not isinstance(call.func, cst.Name) or facts.local_function(call) is not None:
        return False
    callee = call.func.value
    return (
        _built_with(facts, callee, line, optimizer)
        or _reads_scheduler(is_scheduler, callee, line)
        or (_handed_in_beside(facts, call.func, optimizer) and not _computes_a_loss(facts, call.func, step))
    )


def _computes_a_loss(facts: ModuleFacts, callee: cst.Name, step: Set[cst.CSTNode]) -> bool:
    """A line of ``callee``'s function calling it assigns what a backward or one of the
    ``step`` nodes reads, directly or through the lines after it (``losses = loss(out)``;
    ``total = sum(losses.values())``; ``scaler.scale(total).backward()``)."""
    function = facts.enclosing(callee, (cst.FunctionDef,)) or facts.module
    lines = facts.subtree(function, cst.SimpleStatementLine)
    for line in lines:
        if not any(m.matches(c.func, m.Name(callee.value)) for c in facts.subtree(line, cst.Call)):
            continue
        live = _assigned(facts, line)
        for later in lines:
            if facts.order(later) <= facts.order(line) or not live & facts.names_under(later):
                continue
            backward = any(
                m.matches(c.func, m.Attribute(attr=m.Name("backward"))) for c in facts.subtree(later, cst.Call)
            )
            if backward or any(facts.within(node, later) or facts.within(later, node) for node in step):
                return True
            live |= _assigned(facts, later)
    return False


def _assigned(facts: ModuleFacts, line: cst.CSTNode) -> Set[str]:
    """The names under the targets of the assignments of ``line`` (``losses`` of
    ``losses["loss"] = total``)."""
    targets: List[cst.CSTNode] = [t.target for a in facts.subtree(line, cst.Assign) for t in a.targets]
    targets += [a.target for a in facts.subtree(line, cst.AugAssign)]
    targets += [a.target for a in facts.subtree(line, cst.AnnAssign)]
    return {name for target in targets for name in facts.names_under(target)}


def _handed_in_beside(facts: ModuleFacts, callee: cst.Name, optimizer: str) -> bool:
    """``callee`` and ``optimizer`` are both parameters of the function ``callee`` is read in
    (or of one enclosing it)."""
    scope = facts.scope(callee)
    if scope is None or callee.value not in scope:
        return False
    for assignment in scope[callee.value]:
        parameter = getattr(assignment, "node", None)
        function = facts.enclosing(parameter, (cst.FunctionDef,)) if isinstance(parameter, cst.Param) else None
        if function is not None and optimizer in {p.name.value for p in function.params.params}:
            return True
    return False


def _called_name(call: cst.Call) -> str:
    """The name ``call`` calls: ``train`` of ``train(...)``, ``train_step`` of
    ``trainer.train_step(...)``; empty for any other callee."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    return call.func.value if isinstance(call.func, cst.Name) else ""


def may_run_after(facts: ModuleFacts, statement: cst.CSTNode, anchor: cst.CSTNode) -> bool:
    """``statement`` comes after ``anchor`` in source order, or shares a loop with it."""
    if facts.order(statement) > facts.order(anchor):
        return True
    loops = {id(a) for a in facts.ancestors(anchor) if isinstance(a, (cst.For, cst.While))}
    return any(id(a) in loops for a in facts.ancestors(statement))


def _reads_scheduler(is_scheduler: Callable[[str, cst.CSTNode], bool], owner: str, line: cst.CSTNode) -> bool:
    """``owner`` (the receiver of a method call on ``line``) is the optimizer's scheduler; a
    receiver the file does not bind is not one."""
    try:
        return is_scheduler(owner, line)
    except Blocked:
        return False


def _built_with(facts: ModuleFacts, owner: str, line: cst.CSTNode, optimizer: str) -> bool:
    """``owner`` is a name of ``line``'s scope, or an attribute of the instance parameter of
    ``line``'s class (``self.policy``), bound only by calls that are given ``optimizer``
    (``policy = WarmupPolicy(optimizer, base_lr)``): an object that may write the
    optimizer's state whenever one of its methods runs."""
    assigns = _assignments(facts, owner, line)
    return bool(assigns) and all(
        isinstance(a, cst.Assign)
        and isinstance(a.value, cst.Call)
        and any(dotted(arg.value) == optimizer for arg in a.value.args)
        and not _builds_a_trainer(facts, a.value)
        for a in assigns
    )


def _assignments(facts: ModuleFacts, owner: str, line: cst.CSTNode) -> List[Optional[cst.CSTNode]]:
    """The statements binding ``owner`` seen from ``line``: for a name, its assignments in
    ``line``'s scope (empty when it is also bound another way: a parameter, a loop, an
    import); for ``receiver.attribute``, the assignments to it anywhere in ``line``'s class."""
    attribute = owner.partition(".")[2]
    if attribute:
        klass = facts.enclosing(line, (cst.ClassDef,))
        if klass is None or not attribute.isidentifier():
            return []
        return [
            facts.parent(target) for target in facts.subtree(klass, cst.AssignTarget) if dotted(target.target) == owner
        ]
    scope = facts.scope(line)
    if not owner.isidentifier() or scope is None:
        return []
    targets = [facts.parent(getattr(a, "node", None)) for a in scope[owner]]
    assigns = [facts.parent(t) for t in targets if isinstance(t, cst.AssignTarget)]
    return assigns if len(assigns) == len(targets) else []


def _builds_a_trainer(facts: ModuleFacts, call: cst.Call) -> bool:
    """``call`` builds an instance of a class of this module that runs a backward (a trainer
    given the optimizer, ``Trainer(model, optimizer)``): its methods train, they are not
    optimizer writes to order after the step."""
    scope = facts.scope(call)
    if not isinstance(call.func, cst.Name) or scope is None:
        return False
    bound = [getattr(a, "node", None) for a in scope[call.func.value]]
    classes = [node for node in bound if isinstance(node, cst.ClassDef)]
    return any(
        isinstance(c.func, cst.Attribute) and c.func.attr.value == "backward"
        for klass in classes
        for c in facts.subtree(klass, cst.Call)
    )
