"""The refusal of optimizer wrapper classes handed their scaler (fairseq's AMP optimizers, in spirit).

The shape: a class holding a GradScaler on ``self`` next to the torch optimizer it wraps,
behind an optimizer-like interface the training loop calls in turn::

    optimizer.backward(loss)                 # self._grad_scaler.scale(loss).backward()
    grad_norm = optimizer.clip_grad_norm(c)  # self._grad_scaler.unscale_(...); clip_grad_norm_(...)
    optimizer.step()                         # self._grad_scaler.step(...); self._grad_scaler.update()

A class that builds its GradScaler in ``__init__`` is migrated as a whole
(:mod:`migrate.optimizer_wrapper_class`). One handed its scaler from outside
(``self.scaler = scaler``) is not: the scaler is built and may be used elsewhere, so the
class's methods are not the only code that steps it. :func:`split_step_reason` names the
methods in that refusal.
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
        f"then {between}{stepping} (steps through {builder.scaler}) in turn; such a class is migrated as a "
        f"whole when it builds its GradScaler in __init__ (`{builder.scaler} = GradScaler(...)`), but this one "
        "is handed its scaler from outside, which other code may use too; build the scaler in the class, or "
        "migrate by hand)"
    )
