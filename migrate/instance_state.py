"""The attributes of a trainer class that hold what its asynchronous step works on.

A class that wraps ``self.model`` and steps it asynchronously (``self.model.step(_step_fn)``)
leaves its step running when its method returns. A caller in another file holding an
instance (``tr = Trainer(); tr.train_step(x, y)``) that then reads or writes the model, the
optimizer, or anything built from them (``tr.sched.step()``, ``tr.opt.param_groups``,
``tr.ema.update()``) races with that step, and the caller is not migrated with the class.
:func:`step_state_attributes` names those attributes; the scaler itself is not one (the
thread-aware ``roundpipe.GradScaler`` answers each thread for its own iteration).
"""

from __future__ import annotations

import ast
from typing import Optional, Set

__all__ = ["STEPPING", "step_state_attributes"]

#: scaler methods whose argument is the optimizer the step updates
STEPPING = frozenset({"step", "unscale_"})


def step_state_attributes(cls: ast.ClassDef, models: Set[str]) -> Set[str]:
    """The ``self`` attributes of ``cls`` holding step state: the wrapped ``models``, the
    optimizers a ``.step(self.x)``/``.unscale_(self.x)`` call is given, and every attribute
    assigned an expression that reads one of those (``self.sched = StepLR(self.opt, 1)``,
    ``self.ema = EMA(self.model)``), followed until nothing new is found."""
    held = set(models)
    for node in ast.walk(cls):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in STEPPING:
            held |= {a for arg in node.args if (a := _self_attribute(arg)) is not None}
    assigned = [
        (target, node.value)
        for node in ast.walk(cls)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if (target := _self_attribute(t)) is not None
    ]
    grew = True
    while grew:
        grew = False
        for target, value in assigned:
            if target not in held and any(_self_attribute(n) in held for n in ast.walk(value)):
                held.add(target)
                grew = True
    return held


def _self_attribute(node: ast.AST) -> Optional[str]:
    """``x`` for ``self.x``, else None."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None
