"""Which other wrapped models a training step's backward may reach, and whether that is safe.

A trainer class stepping two networks from separate methods (a GAN's ``d_step``/``g_step``
on ``self.G`` and ``self.D``) calls both models in each: the generator's loss runs through
the discriminator, the discriminator's loss through ``self.G(z).detach()``. Each RoundPipe
``model.step`` hands over only its own model's gradients, so gradients a backward leaves on
another model are harmless only when nothing of them reaches that model's own step in a way
the original would not have. That is proven from the code, for every other wrapped model the
step's method calls with gradients, in one of two ways:

* every such call is cut from the graph (``self.G(z).detach()``; calls under
  ``torch.no_grad()``/``inference_mode()`` are not counted as calls with gradients): the
  backward cannot reach that model's parameters;
* that model's own step zeroes its gradients on the model before its backward (its
  ``zero_grad()`` kept in place, :func:`migrate.multi_step.zero_models_in_place`): whatever
  another backward left there is dropped exactly where the original drops it.

Anything else is refused (RPM107) naming the call.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import libcst as cst
import libcst.matchers as m

from .names import ModuleFacts
from .plan import Plan
from .syntax import code

__all__ = ["unproven_reach", "zeroed_in_place_key"]

_DETACHED = m.Call(func=m.Attribute(attr=m.Name("detach")), args=[])


def zeroed_in_place_key(facts: ModuleFacts, backward: cst.CSTNode, model: str) -> Tuple[int, str]:
    """How :attr:`Plan.zeroed_in_place` names ``model`` as the step of ``backward`` sees it:
    an instance attribute (``self.D``) belongs to the class around that step."""
    owner = facts.enclosing(backward, (cst.ClassDef,))
    return (id(owner) if owner is not None else 0, model)


def _detached(facts: ModuleFacts, call: cst.Call) -> bool:
    """``call``'s result goes straight into ``.detach()``."""
    attribute = facts.parent(call)
    if not isinstance(attribute, cst.Attribute) or attribute.value is not call:
        return False
    outer = facts.parent(attribute)
    return isinstance(outer, cst.Call) and m.matches(outer, _DETACHED)


def unproven_reach(
    facts: ModuleFacts, plan: Plan, backward: cst.CSTNode, called: Dict[str, List[cst.Call]]
) -> Optional[Tuple[cst.Call, str]]:
    """For the method of ``backward`` (a recognised step), which calls the wrapped instance
    models ``called`` (name -> its calls with gradients there): the first call whose model
    the backward may reach without proof that this is safe, with the reason; None when every
    reach is proven safe (see the module docstring)."""
    function = facts.enclosing(backward, (cst.FunctionDef,))
    where = f"{function.name.value}()" if isinstance(function, cst.FunctionDef) else "the step"
    trained = plan.trained_models.get(backward)
    by_order = sorted(called, key=lambda name: facts.order(called[name][0]))
    if trained is None:
        first, second = by_order[:2]
        return called[second][0], (
            f"{where} holds a training step and calls two wrapped models with gradients ({first}, "
            f"{second}): its backward may reach the parameters of both, but each RoundPipe step "
            "hands over only its own model's gradients; left untouched"
        )
    for name in by_order:
        live = [call for call in called[name] if not _detached(facts, call)]
        if name == trained or not live or zeroed_in_place_key(facts, backward, name) in plan.zeroed_in_place:
            continue
        return live[0], (
            f"{where} steps {trained} and calls {name} with gradients (`{code(live[0])}`): its "
            f"backward may reach {name}'s parameters, and nothing shows those gradients are dropped "
            f"before {name}'s own step (no `.detach()` on the call, no `torch.no_grad()` around it, "
            f"no `zero_grad()` before {name}'s backward); each RoundPipe step hands over only its "
            "own model's gradients; left untouched"
        )
    return None
