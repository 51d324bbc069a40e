"""Gradient accumulation on both paths of a two-path step: the same condition around each step.

Real two-path scripts accumulate on both paths::

    if use_amp:
        scaler.scale(loss).backward()
        if (i + 1) % accum == 0:
            scaler.unscale_(optimizer); clip...; scaler.step(optimizer); scaler.update()
            optimizer.zero_grad()
    else:
        loss.backward()
        if (i + 1) % accum == 0:
            clip...; optimizer.step(); optimizer.zero_grad()

The plain path (:mod:`migrate.plain_path`) steps unconditionally unless its step sits under
the same condition as the AMP step: then every ``zero_grad()`` around the ``if`` sees the
same iterations stepped on either path, which the AMP step's own rules already judged
(:func:`migrate.rules.step_function.require_every_iteration`). :func:`same_condition` says
whether the two conditions are one: the same source text, an expression that calls nothing
but ``len`` (so evaluating it has no effect), each ``if`` a statement of its path's block
right after the backward's block position, with no statement between the backward and the
``if`` rebinding a name the condition reads.
"""

from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst
import libcst.matchers as m

from .syntax import assigned_names, code, names_in

__all__ = ["same_condition"]


def same_condition(
    plain: cst.If,
    plain_block: Sequence[cst.BaseStatement],
    plain_backward: int,
    amp: Optional[cst.If],
    amp_block: Sequence[cst.BaseStatement],
    amp_backward: int,
) -> bool:
    """``plain`` (in ``plain_block``, whose backward is at index ``plain_backward``) tests
    what ``amp`` (the AMP step's condition, in ``amp_block``) tests, in the sense of the
    module's contract."""
    if amp is None or plain.orelse is not None or amp.orelse is not None:
        return False
    if code(plain.test).strip() != code(amp.test).strip() or not _pure(plain.test):
        return False
    read = set(names_in(plain.test))
    return _unchanged(read, plain, plain_block, plain_backward) and _unchanged(read, amp, amp_block, amp_backward)


def _pure(test: cst.BaseExpression) -> bool:
    calls = m.findall(test, m.Call())
    return all(m.matches(c, m.Call(func=m.Name("len"))) for c in calls) and not m.findall(test, m.NamedExpr())


def _unchanged(read: set, condition: cst.If, block: Sequence[cst.BaseStatement], backward: int) -> bool:
    if condition not in block:
        return False
    between = block[backward + 1 : list(block).index(condition)]
    return all(isinstance(s, cst.SimpleStatementLine) and not read & set(assigned_names(s)) for s in between)
