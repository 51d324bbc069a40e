"""The torch two-path split: the backward picked by an ``if``, the optimizer work after it.

Real scripts that train with or without AMP behind one flag often split only the backward
(examples in :mod:`migrate.rules.torch_two_path`)::

    with torch.autocast("cuda", enabled=use_amp):
        loss = criterion(model(x), y)
    if use_amp:                          # `if scaler is not None`, `if not use_amp` (else first)
        scaler.scale(loss).backward()
    else:
        loss.backward()
    if clip:                             # optional; the unscale under the path's own flag
        if use_amp:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if use_amp:                          # or one shared `scaler.step(optimizer); scaler.update()`
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad()

The step is found after the ``if`` (:func:`migrate.apex_two_path.split_backward` and
:func:`~migrate.apex_two_path.anchor_at_split`, shared with apex's split). Its group may hold a
*two-path step*: an ``if``/``else`` whose AMP branch steps through the scaler and whose plain
branch calls ``optimizer.step()`` on the same optimizer, each with its own unscale/clip. That
``if`` moves into the step function as a whole; the scaler's update in its AMP branch runs on
the main thread after ``model.step``, under the same test.

Both target forms: the fused form where the split's test can move into the loss function (it
calls nothing but ``len`` and ``scaler.is_enabled()``, and the forward binds none of its
names): the loss function returns ``(scaler.scale(loss) if test else loss)`` and the ``if``
goes; otherwise the autograd form, both backwards kept as written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, FrozenSet, List, Optional, Sequence, Set, Tuple

import libcst as cst
import libcst.matchers as m

from . import templates
from .apex_two_path import SplitBackward, anchor_at_split, split_backward
from .edits import carry_comments
from .multi_step import schedules
from .plan import Blocked
from .rules import step_function
from .rules.loss_function import ForwardPlan, ForwardRegion
from .rules.step_function import StepBody
from .step_values import GUARDABLE, branches
from .steps import StepBuilder
from .syntax import code, dotted, method_call, only_expression

if TYPE_CHECKING:
    from .torch_amp import TorchAmpRules

__all__ = ["TwoPathStep", "step_builder"]

#: what the AMP branch of a two-path step may hold (besides zeroing its optimizer and
#: stepping a scheduler of it, in either branch)
_AMP_WORK = frozenset({"unscale", "clip", "measure", "guarded", "step", "update"})
#: what the plain branch may hold besides its one ``optimizer.step()``
_PLAIN_WORK = frozenset({"clip", "measure", "guarded"})
#: kinds whose ``if`` the step function takes as a whole, its inner statements step statements too
_COMPOUND = frozenset({"guarded", "decided", "two_path"})


def step_builder(
    rules: "TorchAmpRules", scaler: str, backward: cst.SimpleStatementLine, loss: cst.BaseExpression
) -> StepBuilder:
    """The builder of the step around ``backward``: a :class:`TwoPathStep` where it is one
    branch of a two-path split, else a plain :class:`~migrate.steps.StepBuilder`."""
    step = StepBuilder(rules, scaler, backward, loss)
    split = split_backward(step)
    return step if split is None else TwoPathStep(rules, scaler, backward, loss, split)


class TwoPathStep(StepBuilder):
    """The step of a torch two-path split (module docstring): found after the split's ``if``."""

    step_rewrite = "two-path optimizer step -> model.step(step_fn); scaler.update() kept"

    def __init__(
        self,
        rules: "TorchAmpRules",
        scaler: str,
        backward: cst.SimpleStatementLine,
        loss: cst.BaseExpression,
        split: SplitBackward,
    ) -> None:
        super().__init__(rules, scaler, backward, loss)
        self.split = split
        self.split_if = split.statement  # the `if` choosing the backward
        anchor_at_split(self, split)

    # ------------------------------------------------------------ the two forms
    def check_fusable(self) -> None:
        """The fused form evaluates the split's test in the loss function, after the
        forward, as the original did after it: the test must be a plain read of names the
        statements before the split in its block do not bind (else the autograd form)."""
        super().check_fusable()
        test = self.split_if.test
        why = self._calls_something(test)
        bound = _rebound(test, {n for s in self.body[: self.index] for n in _bound_in(s)})
        if why is None and bound:
            why = f"reads {', '.join(bound)}, bound before it in its block"
        if why is not None:
            raise Blocked(
                self.backward,
                "RPM107",
                f"the two-path backward `if {code(test)}:` cannot move into the loss function: its test {why}",
            )

    def scaled_loss(self) -> str:
        """``(scaler.scale(loss) if test else loss)``, the branches in the split's order."""
        scaled, plain = super().scaled_loss(), code(self.loss)
        test = self.split_if.test
        condition = f"({code(test)})" if isinstance(test, (cst.IfExp, cst.Lambda)) else code(test)
        first, second = (scaled, plain) if self.split_if.body is self.facts.parent(self.backward) else (plain, scaled)
        return f"({first} if {condition} else {second})"

    def replaced_backward(self) -> cst.BaseStatement:
        return self.split_if

    def fused_form_planned(self, region: ForwardRegion, zero_grads: List[int], forward: ForwardPlan) -> None:
        self.rules.plan.rewrites.append(
            (self.split_if, "two-path backward -> forward_backward; the loss function scales the loss on the AMP path")
        )

    # ------------------------------------------------------------ the step group
    def classify(self, statement: cst.BaseStatement) -> Optional[str]:
        kind = super().classify(statement)
        if kind is not None or not isinstance(statement, cst.If):
            return kind
        if statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):  # `if clip: if amp: unscale_`
            inner = [self.classify(s) for s in statement.body.body]
            return "guarded" if all(k in GUARDABLE or k == "guarded" for k in inner) else None
        return "two_path" if self._paths(statement) is not None else None

    def with_kinds(self, group: List[cst.BaseStatement]) -> List[Tuple[cst.BaseStatement, Optional[str]]]:
        found: List[Tuple[cst.BaseStatement, Optional[str]]] = []
        for statement in group:
            kind = self.classify(statement)
            found.append((statement, kind))
            if kind in _COMPOUND and isinstance(statement, cst.If):
                found += self.with_kinds([inner for part in branches(statement) for inner in part])
        return found

    def optimizer_of(self, group: List[cst.BaseStatement]) -> str:
        """The optimizer of ``group``, a two-path step standing for its AMP branch once its
        plain branch is checked to step the same optimizer (:meth:`_check_two_path_step`)."""
        view: List[cst.BaseStatement] = []
        for statement in group:
            if self.classify(statement) == "two_path" and isinstance(statement, cst.If):
                view += self._check_two_path_step(statement)
            else:
                view.append(statement)
        return step_function.optimizer_of(self, view)

    def step_body(self, updated: List[cst.BaseStatement], kinds: List[Optional[str]], optimizer: str) -> StepBody:
        """The scaler's update in a two-path step's AMP branch leaves it for the main thread,
        under the step's own test (``if use_amp: scaler.update()``)."""
        statements = list(updated)
        branch_update: Optional[cst.BaseStatement] = None
        for position, kind in enumerate(kinds):
            if kind == "two_path" and isinstance(statements[position], cst.If):
                statements[position], found = self._update_out_of(cst.ensure_type(statements[position], cst.If))
                branch_update = branch_update or found
        inside, update = super().step_body(statements, kinds, optimizer)
        return inside, update or branch_update

    # ------------------------------------------------------------ two-path steps
    def _paths(self, statement: cst.If) -> Optional[Tuple[List[cst.BaseStatement], List[cst.BaseStatement]]]:
        """(AMP branch, plain branch) of an ``if``/``else`` (no ``elif``) one branch of which
        steps through the scaler while the other never uses it and calls ``<x>.step()``."""
        if not isinstance(statement.orelse, cst.Else):
            return None
        parts = branches(statement)
        if not all(parts):
            return None
        for amp, plain in (parts, parts[::-1]):
            steps_amp = any(self.classify(s) == "step" for s in amp)
            if steps_amp and not any(self.mentions(s, self.scaler) for s in plain) and self._plain_steps(plain):
                return amp, plain
        return None

    def _plain_steps(self, plain: Sequence[cst.BaseStatement]) -> List[cst.Call]:
        """The ``<x>.step()`` calls (no arguments) of ``plain`` that step no scheduler."""
        found = []
        for statement in plain:
            call = only_expression(statement)
            if m.matches(call or cst.Pass(), m.Call(func=m.Attribute(attr=m.Name("step")), args=[])):
                assert isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)  # as matched
                if self.classify(statement) != "scheduler":
                    found.append(call)
        return found

    def _check_two_path_step(self, statement: cst.If) -> List[cst.BaseStatement]:
        """The AMP branch of the two-path step ``statement``, after checking that each
        branch holds only optimizer work, that both step one optimizer once, and that the
        test may be read again in the step function and on the main thread; raises
        :class:`Blocked` (RPM135) naming what does not."""
        paths = self._paths(statement)
        assert paths is not None  # classified as a two-path step
        amp, plain = paths
        amp_steps = [only_expression(s) for s in amp if self.classify(s) == "step"]
        plain_steps = self._plain_steps(plain)
        stepped = {code(c.args[0].value) for c in amp_steps if isinstance(c, cst.Call) and c.args}
        stepped |= {code(c.func.value) for c in plain_steps if isinstance(c.func, cst.Attribute)}
        if len(amp_steps) != 1 or len(plain_steps) != 1 or len(stepped) != 1:
            raise Blocked(
                statement,
                "RPM135",
                f"the branches of `if {code(statement.test)}:` do not step one optimizer once each "
                f"(`{'`, `'.join(sorted(stepped))}`): one `model.step` serves one optimizer; "
                "migrate this step by hand",
            )
        optimizer = stepped.pop()
        plain_lines = {s for s in plain if only_expression(s) in set(plain_steps)}
        for branch, allowed, which in ((amp, _AMP_WORK, "AMP"), (plain, _PLAIN_WORK, "plain")):
            extra = [s for s in branch if s not in plain_lines and not self._branch_work(s, allowed, optimizer)]
            if extra:
                raise Blocked(
                    extra[0],
                    "RPM135",
                    f"the {which} branch of the two-path step `if {code(statement.test)}:` holds "
                    f"`{code(extra[0]).strip().splitlines()[0]}`, which is not work on `{optimizer}` the "
                    "step function can take; migrate this step by hand",
                )
        why = self._test_not_kept(statement.test)
        if why is not None:
            raise Blocked(
                statement,
                "RPM135",
                f"the two-path step `if {code(statement.test)}:` moves into the step function and "
                f"its test is read again for the scaler's update on the main thread, but it {why}; "
                "migrate this step by hand",
            )
        return amp

    def _branch_work(self, statement: cst.BaseStatement, allowed: FrozenSet[str], optimizer: str) -> bool:
        """``statement`` of a two-path step's branch is optimizer work of a kind in
        ``allowed``, or zeroes ``optimizer`` or steps a scheduler that may drive it."""
        kind = self.classify(statement)
        call = only_expression(statement)
        owner = code(call.func.value) if isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute) else None
        if kind == "zero_grad":
            return owner == optimizer
        if kind == "scheduler":
            return owner is not None and schedules(self, owner, statement, optimizer)
        return kind in allowed

    def _test_not_kept(self, test: cst.BaseExpression) -> Optional[str]:
        """Why the value of ``test`` may differ where it is read again (a call with effects,
        a name rebound in a loop around the step, which an asynchronous step function may
        read after it changed); None when it may be read anywhere in the iteration."""
        why = self._calls_something(test)
        if why is not None:
            return why
        bound: Set[str] = set()
        for ancestor in self.facts.ancestors(self.split_if):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
                break
            if isinstance(ancestor, (cst.For, cst.While)):
                bound |= _bound_in(ancestor)
        rebound = _rebound(test, bound)
        return f"reads {', '.join(rebound)}, which a loop around the step rebinds" if rebound else None

    def _calls_something(self, test: cst.BaseExpression) -> Optional[str]:
        """Why ``test`` is not a plain read: a call other than ``len(...)`` or the scaler's
        ``is_enabled()``, an assignment expression, ``await`` or ``yield``."""
        for call in m.findall(test, m.Call()):
            assert isinstance(call, cst.Call)
            if m.matches(call, m.Call(func=m.Name("len"))) or any(
                method_call(call, s, "is_enabled") for s in self.scaler_spellings
            ):
                continue
            return f"calls `{code(call)}`"
        if m.findall(test, m.NamedExpr() | m.Await() | m.Yield()):
            return "binds or awaits a value"
        return None

    def _update_out_of(self, statement: cst.If) -> Tuple[cst.If, Optional[cst.BaseStatement]]:
        """``statement`` without the scaler's update in its AMP branch, and that update as
        ``if <the branch's test>: scaler.update()`` (carrying its comments)."""
        parts = [statement.body, cst.ensure_type(statement.orelse, cst.Else).body]
        for index, part in enumerate(parts):
            body = list(cst.ensure_type(part, cst.IndentedBlock).body)
            updates = [s for s in body if self._is_update(s)]
            if not updates:
                continue
            kept = part.with_changes(body=[s for s in body if s is not updates[0]])
            test = code(statement.test) if index == 0 else _negated(statement.test)
            update = templates.statement(f"if {test}:\n    {code(only_expression(updates[0]) or cst.Pass())}\n")
            if index == 0:
                return statement.with_changes(body=kept), carry_comments(updates, update)
            orelse = cst.ensure_type(statement.orelse, cst.Else).with_changes(body=kept)
            return statement.with_changes(orelse=orelse), carry_comments(updates, update)
        return statement, None

    def _is_update(self, statement: cst.BaseStatement) -> bool:
        value = only_expression(statement)
        return isinstance(value, cst.Call) and any(method_call(value, s, "update") for s in self.scaler_spellings)


def _bound_in(node: cst.CSTNode) -> Set[str]:
    """What ``node`` binds, spelled as read (``x``, ``self.amp``, ``args["amp"]``): the
    targets of its assignments, loops, ``with ... as`` and assignment expressions."""
    targets: List[cst.CSTNode] = []
    for found in m.findall(node, m.Assign() | m.AugAssign() | m.AnnAssign() | m.For() | m.AsName() | m.NamedExpr()):
        if isinstance(found, cst.Assign):
            targets += [t.target for t in found.targets]
        elif isinstance(found, (cst.AugAssign, cst.AnnAssign, cst.For, cst.NamedExpr)):
            targets.append(found.target)
        elif isinstance(found, cst.AsName):
            targets.append(found.name)
    spelled: Set[str] = set()
    while targets:
        target = targets.pop()
        if isinstance(target, (cst.Tuple, cst.List)):
            targets += [e.value for e in target.elements]
        elif isinstance(target, cst.StarredElement):
            targets.append(target.value)
        else:
            spelled.add(dotted(target) or code(target))
    return spelled


def _rebound(test: cst.BaseExpression, bound: Set[str]) -> List[str]:
    """The values ``test`` reads (a name, ``self.amp``) that a binding in ``bound``
    replaces, itself or an object it is read from."""
    attributes = {id(a.attr) for a in m.findall(test, m.Attribute()) if isinstance(a, cst.Attribute)}
    spelled = m.findall(test, m.Name() | m.Attribute() | m.Subscript())
    reads = {dotted(n) for n in spelled if id(n) not in attributes}  # `fp16` of `args.fp16` is no read
    return sorted(r for r in reads if r is not None and any(r == b or r.startswith(f"{b}.") for b in bound))


def _negated(test: cst.BaseExpression) -> str:
    """Source text testing the opposite of ``test``."""
    if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
        return code(test.expression)
    if isinstance(test, cst.Comparison) and len(test.comparisons) == 1:
        target = test.comparisons[0]
        flipped = next((b for a, b in _OPPOSITES if isinstance(target.operator, a)), None)
        if flipped is not None:
            return f"{code(test.left)} {flipped} {code(target.comparator)}"
    if isinstance(test, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)):
        return f"not {code(test)}"
    return f"not ({code(test)})"


#: comparison operators and the spelling of their opposite
_OPPOSITES = ((cst.Is, "is not"), (cst.IsNot, "is"), (cst.Equal, "!="), (cst.NotEqual, "=="))
