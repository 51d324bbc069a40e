"""An optimizer step chosen by a gradient norm measured in the step.

Real trainers measure the norm after ``unscale_`` and let it decide what the iteration does
(ESPnet, fairseq, many speech and LM trainers)::

    grad_norm = clip_grad_norm_(model.parameters(), clip)
    if not torch.isfinite(grad_norm):
        logging.warning("skipping")
        skipped += 1
        scaler.step(optimizer)
        scaler.update()
    else:
        scaler.step(optimizer)
        scaler.update()

In RoundPipe the norm exists only inside the step function (it is measured on the optimizer
copies, which hold the gradients once ``model.step`` has handed them over), so the ``if``
moves there with it: a *decided* ``if`` is one whose test reads a norm measured earlier in
the step and whose branches hold only optimizer work and statements that may run in the step
function (calls such as logging, counters, plain assignments; nested ``if`` blocks of those).
``scaler.update()`` ending every branch runs once after ``model.step`` on the main thread, as
the step's own update does. A step holding such main-thread work runs synchronously
(``is_async=False``), so that work happens at its place in the iteration and the names it
binds reach the main thread (``nonlocal``, :func:`migrate.step_values.escaping_values`).

What cannot move is refused with the statement that blocks (:func:`decision_blocker`): a
``continue``/``break``/``return`` (they act on the loop or function around the step),
``raise``/``assert`` (a step function that raises drops the gradients it was handed, which the
original kept), loops, ``with``/``try`` blocks, gradient reads outside a recognised measure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Set

import libcst as cst
import libcst.matchers as m

from .edits import carry_comments
from .plan import Blocked
from .step_values import branches, classify_value_statement
from .syntax import code, dotted, method_call, names_in, names_outside, only_expression, written_and_read

if TYPE_CHECKING:
    from .steps import StepBuilder, StepGroup

__all__ = [
    "Blocker",
    "decision_blocker",
    "decision_kinds",
    "is_decided",
    "main_thread_work",
    "measured_before",
    "plan_branch_updates",
    "refuse_step_chosen_by_a_measure",
]

#: kinds of step statements a decided ``if`` may hold at the top of its branches
_OPTIMIZER_KINDS = frozenset({"unscale", "clip", "measure", "guarded", "step", "update", "zero_grad", "scheduler"})
_SIDE_SMALL = (cst.Expr, cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Pass)
_RAISES = "(a step function that raises drops the gradients it was handed; the original kept them)"
_LEAVES = (
    (m.Continue(), "a `continue` (it skips the rest of the loop iteration, which a step function cannot do)"),
    (m.Break(), "a `break` (it leaves the loop, which a step function cannot do)"),
    (m.Return(), "a `return` (it leaves the training function, which a step function cannot do)"),
    (m.Raise(), f"a `raise` {_RAISES}"),
    (m.Assert(), f"an `assert` {_RAISES}"),
)
_GRADIENT_READ = m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters"))) | m.Attribute(
    attr=m.Name("grad")
)
_OPTIMIZER_CALL = m.Call(func=m.Attribute(attr=m.Name("step") | m.Name("unscale_") | m.Name("update")))


@dataclass(frozen=True)
class Blocker:
    """Why a decided ``if`` cannot move into the step function: ``node`` is the statement
    that blocks, ``reason`` says what it is."""

    node: cst.CSTNode
    reason: str


def measured_before(builder: "StepBuilder", statement: cst.BaseStatement) -> Set[str]:
    """The names that ``statement``'s ``if`` test reads and that a gradient-norm measure
    (``name = clip_grad_norm_(...)``, see :mod:`migrate.step_values`) binds in an earlier
    statement of the same block, or in the branches of an earlier ``if`` there."""
    if not isinstance(statement, cst.If):
        return set()
    tested = set(names_in(statement.test))
    block = builder.facts.parent(statement)
    if not tested or not isinstance(block, (cst.IndentedBlock, cst.Module)):
        return set()
    body = list(block.body)
    found: Set[str] = set()
    for earlier in body[: body.index(statement)]:
        lines = [earlier] if isinstance(earlier, cst.SimpleStatementLine) else []
        if isinstance(earlier, cst.If):
            lines = [s for part in branches(earlier) for s in part if isinstance(s, cst.SimpleStatementLine)]
        for line in lines:
            written = written_and_read(line)[0] & tested
            if written and classify_value_statement(builder, line) == "measure":
                found |= written
    return found


def is_decided(builder: "StepBuilder", statement: cst.BaseStatement) -> bool:
    """``statement`` is an ``if`` chosen by a measured norm that moves into the step
    function as a whole (see the module docstring); it must not follow the scaler's update
    (what it does would then run before that update)."""
    if not isinstance(statement, cst.If) or not measured_before(builder, statement):
        return False
    return not _after_update(builder, statement) and decision_blocker(builder, statement) is None


def _after_update(builder: "StepBuilder", statement: cst.BaseStatement) -> bool:
    block = builder.facts.parent(statement)
    body = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
    earlier = body[: body.index(statement)] if statement in body else []
    return any(_is_update(builder, s) for s in earlier)


def _is_update(builder: "StepBuilder", statement: cst.CSTNode) -> bool:
    value = only_expression(statement) if isinstance(statement, cst.BaseStatement) else None
    return isinstance(value, cst.Call) and method_call(value, builder.scaler, "update")


def decision_blocker(builder: "StepBuilder", statement: cst.If) -> Optional[Blocker]:
    """The first statement of the ``if`` chain that keeps it out of the step function, or
    None when it can move there."""
    if not all(isinstance(part, cst.IndentedBlock) for part in _suites(statement)):
        one_line = next(p for p in _suites(statement) if not isinstance(p, cst.IndentedBlock))
        return _side_blocker(builder, one_line) or Blocker(statement, "a branch written on the `if` line")
    parts = branches(statement)
    for part in parts:
        for inner in part:
            if builder.classify(inner) in _OPTIMIZER_KINDS:
                continue
            blocker = _side_blocker(builder, inner)
            if blocker is not None:
                return blocker
    return _update_blocker(builder, statement, parts) or _step_blocker(builder, parts)


def _suites(statement: cst.If) -> List[cst.BaseSuite]:
    found: List[cst.BaseSuite] = []
    node: cst.CSTNode = statement
    while isinstance(node, cst.If):
        found.append(node.body)
        node = node.orelse  # type: ignore[assignment]
    if isinstance(node, cst.Else):
        found.append(node.body)
    return found


def _side_blocker(builder: "StepBuilder", node: cst.CSTNode) -> Optional[Blocker]:
    """Why ``node`` (a statement, or a one-line suite) cannot run in the step function."""
    for leaves, reason in _LEAVES:
        found = m.findall(node, leaves)
        if found:
            return Blocker(found[0], reason)
    if m.findall(node, m.NamedExpr() | m.Yield() | m.Await()):
        return Blocker(node, "an assignment expression, `yield` or `await`")
    if isinstance(node, cst.If):
        for part in branches(node):
            for inner in part:
                blocker = _side_blocker(builder, inner)
                if blocker is not None:
                    return blocker
        return None if all(branches(node)) else Blocker(node, "a branch written on the `if` line")
    if not isinstance(node, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return Blocker(node, f"a `{_keyword(node)}` block")
    if not all(isinstance(small, _SIDE_SMALL) for small in node.body):
        return Blocker(node, f"`{code(node).strip()}`")
    if m.findall(node, _GRADIENT_READ):
        return Blocker(node, f"`{code(node).strip()}`, which reads the gradients outside a recognised measure")
    if m.findall(node, _OPTIMIZER_CALL):
        return Blocker(node, f"`{code(node).strip()}`, optimizer work of a form the step rules do not recognise")
    return None


def _keyword(node: cst.CSTNode) -> str:
    return type(node).__name__.lower().replace("statement", "")


def _update_blocker(
    builder: "StepBuilder", statement: cst.If, parts: List[List[cst.BaseStatement]]
) -> Optional[Blocker]:
    """``scaler.update()`` in a decided ``if`` must end every branch (an ``else`` included),
    the same call each time, so that it runs once per iteration after the step."""
    updates = [s for part in parts for s in part if _is_update(builder, s)]
    if not updates:
        return None
    has_else = isinstance(_suites(statement)[-1], cst.IndentedBlock) and isinstance(_last_orelse(statement), cst.Else)
    ends_each = all(part and _is_update(builder, part[-1]) for part in parts)
    same = len({code(only_expression(u) or cst.Pass()) for u in updates}) == 1
    if has_else and ends_each and same and len(updates) == len(parts):
        return None
    return Blocker(
        updates[0],
        f"`{code(updates[0]).strip()}` in only some of its branches or not at their end (it must end "
        "every branch, an `else` included, to update the scale once per iteration after the step)",
    )


def _last_orelse(statement: cst.If) -> Optional[cst.CSTNode]:
    """The ``else`` (or last ``elif``'s missing one, None) ending an ``if`` chain."""
    node: cst.CSTNode = statement
    while isinstance(node, cst.If):
        if node.orelse is None:
            return None
        node = node.orelse
    return node


def _step_blocker(builder: "StepBuilder", parts: List[List[cst.BaseStatement]]) -> Optional[Blocker]:
    steps = [s for part in parts for s in part if builder.classify(s) == "step"]
    if len({code(only_expression(s) or cst.Pass()) for s in steps}) > 1:
        return Blocker(steps[1], "branches that step different optimizers")
    if any(sum(1 for s in part if builder.classify(s) == "step") > 1 for part in parts):
        return Blocker(steps[1], "a branch that steps twice")
    return None


def decision_kinds(builder: "StepBuilder", group: Sequence[cst.BaseStatement]) -> List[Optional[str]]:
    """The kinds of a step group's statements, a decided ``if`` counted as the step and the
    update it holds (once each, however many branches repeat them)."""
    kinds: List[Optional[str]] = []
    for statement in group:
        kind = builder.classify(statement)
        if kind != "decided" or not isinstance(statement, cst.If):
            kinds.append(kind)
            continue
        inner = {builder.classify(s) for part in branches(statement) for s in part}
        kinds += [k for k in ("step", "update") if k in inner]
    return kinds


def plan_branch_updates(builder: "StepBuilder", group: Sequence[cst.BaseStatement]) -> Optional[cst.BaseStatement]:
    """For a decided ``if`` whose branches end with ``scaler.update()``: plan dropping those
    lines and return the one update to run after ``model.step`` on the main thread (it
    carries their comments); None when no branch updates. An ``else`` left empty goes
    (unless its own lines hold a comment); another branch left empty gets ``pass``."""
    for statement in group:
        if builder.classify(statement) != "decided" or not isinstance(statement, cst.If):
            continue
        suites = [s for s in _suites(statement) if isinstance(s, cst.IndentedBlock)]
        ends = [suite.body[-1] for suite in suites if suite.body and _is_update(builder, suite.body[-1])]
        if not ends:
            continue
        for suite in suites:
            last = len(suite.body) - 1
            builder.rules.plan.edits.replace_range(suite, last, last + 1, _pass if last == 0 else _nothing)
        last_else = _last_orelse(statement)
        owner = builder.facts.parent(last_else) if last_else is not None else None
        if isinstance(owner, cst.If) and _bare_else(owner.orelse):
            builder.rules.plan.edits.replace_expression(owner, lambda updated: updated.with_changes(orelse=None))
        call = only_expression(ends[0])
        return carry_comments(ends, cst.parse_statement(f"{code(call or cst.Pass())}\n"))
    return None


def _bare_else(orelse: Optional[cst.CSTNode]) -> bool:
    """An ``else`` holding one statement and no comment of its own."""
    if not isinstance(orelse, cst.Else) or not isinstance(orelse.body, cst.IndentedBlock):
        return False
    if len(orelse.body.body) != 1:
        return False
    return not m.findall(orelse.with_changes(body=orelse.body.with_changes(body=[])), m.Comment())


def _pass(_: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    return [cst.parse_statement("pass\n")]


def _nothing(_: List[cst.BaseStatement]) -> List[cst.BaseStatement]:
    return []


def main_thread_work(builder: "StepBuilder", group: Sequence[cst.BaseStatement]) -> List[cst.BaseStatement]:
    """The statements of the decided ``if`` blocks of ``group`` that are not optimizer work
    (logging, counters): they make the step synchronous."""
    found: List[cst.BaseStatement] = []
    for statement in group:
        if builder.classify(statement) == "decided" and isinstance(statement, cst.If):
            found += [s for part in branches(statement) for s in part if builder.classify(s) not in _OPTIMIZER_KINDS]
    return found


def refuse_step_chosen_by_a_measure(builder: "StepBuilder", found: "StepGroup") -> None:
    """Raise :class:`Blocked` for a gradient norm measured after ``scaler.update()`` (RPM134),
    and for an ``if`` right after the step statements whose test reads a norm they measure
    and which cannot move into the step function with them (``if not torch.isfinite(norm):
    continue``; an ``if`` that can move is one of the step statements,
    the module docstring), naming the statement that blocks (RPM135). An ``if`` after the
    step that does not use the scaler reads the norm on the main thread and is not refused."""
    kinds = [builder.classify(s) for s in found.statements]
    if "update" in kinds and "measure" in kinds[kinds.index("update") :]:
        raise Blocked(
            found.statements[kinds.index("measure", kinds.index("update"))],
            "RPM134",
            "a gradient norm measured after scaler.update(): in RoundPipe the gradients are the "
            "optimizer copies' by then and the scale the step used is gone; measure it before "
            "scaler.step(), or migrate by hand",
        )
    statements = list(found.block.body) if isinstance(found.block, (cst.IndentedBlock, cst.Module)) else []
    measured = {
        n for s, kind in builder.with_kinds(list(found.statements)) if kind == "measure" for n in written_and_read(s)[0]
    }
    if not measured or found.end >= len(statements):
        return
    following = statements[found.end]
    if not isinstance(following, cst.If):
        return
    decided_by = sorted(measured & set(names_outside(builder.facts, following.test, set())))
    if not decided_by:
        return
    if "step" in decision_kinds(builder, found.statements):  # after the step: reads the norm, unless it steps again
        again = m.Call(func=m.Attribute(attr=m.Name("step") | m.Name("update")))
        calls = [c for c in m.findall(following, again) if dotted(c.func.value) == builder.scaler]  # type: ignore[attr-defined]
        blocker = Blocker(calls[0], f"`{code(calls[0])}` again") if calls else None
    else:
        blocker = decision_blocker(builder, following)
    if blocker is None:
        return
    raise Blocked(
        blocker.node,
        "RPM135",
        f"the optimizer step is chosen by `{code(following.test)}`, which reads "
        f"{', '.join(decided_by)} measured from the gradients after the backward; in RoundPipe "
        "that value exists only inside the step function, where this `if` would have to move, "
        f"but it holds {blocker.reason}; migrate this step by hand",
    )
