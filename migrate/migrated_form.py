"""RoundPipe's autograd form, recognised where the migration wrote it (idempotence).

The autograd form keeps ``scaler.scale(loss).backward()`` on the main thread and moves the
optimizer step into a function handed to the model (``def _step_fn(): scaler.step(
optimizer) ...``; ``model.step(_step_fn)``). Run again on such a file whose scaler comes
from another file (a ``roundpipe.GradScaler`` built by the caller), the backward is already
migrated, not an unfollowed torch one.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts

__all__ = ["in_autograd_form"]


def in_autograd_form(facts: ModuleFacts, backward: cst.Call, scaler: str) -> bool:
    """``backward`` (``scaler.scale(...).backward()``) is followed, in its own block, by a
    ``x.step(fn, ...)`` call whose ``fn`` is a function defined in that block calling
    ``scaler.step(...)``."""
    statement = facts.statement_of(backward)
    block = facts.parent(statement)
    if not isinstance(block, (cst.IndentedBlock, cst.Module)) or statement not in block.body:
        return False
    later = block.body[block.body.index(statement) + 1 :]
    stepping = {
        function.name.value
        for function in later
        if isinstance(function, cst.FunctionDef)
        and m.findall(function, m.Call(func=m.Attribute(value=m.Name(scaler), attr=m.Name("step"))))
    }
    handed = m.Call(func=m.Attribute(attr=m.Name("step")), args=[m.Arg(value=m.Name()), m.ZeroOrMore()])
    return any(
        isinstance(call.args[0].value, cst.Name) and call.args[0].value.value in stepping
        for line in later
        if isinstance(line, cst.SimpleStatementLine)
        for call in m.findall(line, handed)
        if isinstance(call, cst.Call)
    )
