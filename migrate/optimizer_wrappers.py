"""Optimizer wrapper classes that own the scaler (fairseq's AMP optimizers, in spirit).

The shape: a class holding a GradScaler on ``self`` next to the torch optimizer it wraps,
behind an optimizer-like interface the training loop calls in turn::

    optimizer.backward(loss)                 # self._grad_scaler.scale(loss).backward()
    grad_norm = optimizer.clip_grad_norm(c)  # self._grad_scaler.unscale_(...); clip_grad_norm_(...)
    optimizer.step()                         # self._grad_scaler.step(...); self._grad_scaler.update()

In RoundPipe the gradients reach the optimizer copies only inside ``model.step``, so the
optimizer work of several methods, called one after the other from the caller's thread, has
no one place to go: a norm that ``clip_grad_norm()`` returns before ``step()`` runs does not
exist yet where it is asked for. No RoundPipe-aware version of such a class is generated;
:func:`split_step_reason` names the methods in the refusal, so the user sees what to merge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, List, Optional

import libcst as cst

from .syntax import method_call

if TYPE_CHECKING:
    from .steps import StepBuilder

__all__ = ["split_step_reason"]

#: the methods that make a class holding a scaler an optimizer wrapper
_OPTIMIZER_INTERFACE = frozenset({"backward", "step", "zero_grad"})


def _methods_calling(builder: "StepBuilder", owner: cst.ClassDef, method: str) -> List[str]:
    """The names of ``owner``'s methods that call ``<the step's scaler>.<method>(...)``."""
    found = []
    for statement in owner.body.body:
        if isinstance(statement, cst.FunctionDef) and any(
            method_call(call, builder.scaler, method) for call in builder.facts.subtree(statement, cst.Call)
        ):
            found.append(statement.name.value)
    return found


def split_step_reason(builder: "StepBuilder", function: cst.FunctionDef) -> Optional[str]:
    """Why the step of a backward ending ``function``, a method of a class holding the
    scaler on ``self`` with an optimizer's interface (``backward``, ``step``, ``zero_grad``),
    is not migrated when another method of that class steps through the scaler (the
    optimizer-wrapper shape); None for any other shape."""
    owner = builder.facts.parent(builder.facts.parent(function) or function)
    if not builder.scaler.startswith("self.") or not isinstance(owner, cst.ClassDef):
        return None
    methods = {s.name.value for s in owner.body.body if isinstance(s, cst.FunctionDef)}
    if not _OPTIMIZER_INTERFACE <= methods:
        return None  # a trainer's mixins, not an optimizer-like class
    steps = [name for name in _methods_calling(builder, owner, "step") if name != function.name.value]
    if not steps:
        return None
    unscales = [name for name in _methods_calling(builder, owner, "unscale_") if name not in steps]
    between = "".join(f"{name}() (unscales), " for name in unscales)
    stepping = ", ".join(f"{name}()" for name in steps)
    return (
        f" ({owner.name.value} is an optimizer wrapper: the training loop calls {function.name.value}(), "
        f"then {between}{stepping} (steps through {builder.scaler}) in turn; in RoundPipe the gradients "
        "reach the optimizer copies only inside model.step, so that work must run in one step function, "
        "and a value returned before the step (a clipped norm) would not exist yet; no RoundPipe-aware "
        "version of this class is generated: migrate it by hand, e.g. with one model.step in "
        f"{stepping} running unscale_, clipping and {builder.scaler}.step)"
    )
