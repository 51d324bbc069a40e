"""The exit of one ``scale_loss`` block: the model's gradients, unscaled, onto the copies.

apex unscales at the exit of every ``amp.scale_loss`` block, not at the step. With master
weights (O2) the float16 model gradients of the block are unscaled into the float32 master
gradients, added to what earlier blocks stashed there, and the model gradients are dropped;
without them (O1, O3) each parameter's gradient of the block is unscaled in place and added
to the gradient stashed by earlier blocks. Either way the running sum is kept unscaled, in
the optimizer's dtype, and each block is unscaled with the scale it was scaled by.

On RoundPipe the optimizer's parameters are the copies (the float32 masters under O2, the
same-dtype copies otherwise), so the sum lives in the copies' ``.grad`` in every level.
:func:`unscale_block_` does apex's arithmetic with the operations apex's Python code uses,
so results are bitwise apex's:

* a copy without a gradient gets the model gradient cast to its dtype (an exact widening
  for float16 -> float32), multiplied in place by ``1/S`` (a Python float: the multiplier is
  ``1/S`` computed in double and rounded to the tensor's compute type, as apex's);
  the multiplication is left out when ``1/S == 1``, as apex leaves it out;
* a copy with a gradient has ``copy.grad.add_(model_grad, alpha=1/S)`` applied.

Overflow is checked on the block's own gradients only, element by element (inf or NaN), as
apex's fused kernel does; gradients stashed by earlier blocks are not checked (apex neither).

Thread and device contract: main thread, while no optimizer job uses the copies (the caller
waits for the optimizer first); any device; one host sync (the overflow flag) per call.
"""

from __future__ import annotations

from typing import Sequence, Tuple

import torch
from torch import nn

from .. import optim_stream
from ..scaling import sum_found_inf, unscale_grads_

__all__ = ["unscale_block_"]

Pair = Tuple[nn.Parameter, nn.Parameter]  # (model parameter, its optimizer copy)


def unscale_block_(pairs: Sequence[Pair], loss_scale: float, check_overflow: bool) -> bool:
    """Move the block's model gradients, unscaled by ``loss_scale``, onto the copies.

    Args:
        pairs: ``(model parameter, optimizer copy)`` for every trainable parameter.
        loss_scale: the scale the block's loss was multiplied by (a Python number).
        check_overflow: look for inf/NaN in the block's gradients.

    Returns:
        True when ``check_overflow`` and a gradient of the block is not finite (the
        gradients are moved all the same; the caller skips the next step).

    Every model gradient is None afterwards.
    """
    fresh = [(param, copy) for param, copy in pairs if param.grad is not None]
    overflow = check_overflow and _has_non_finite([param for param, _ in fresh])
    inverse = 1.0 / loss_scale
    with torch.no_grad():
        # The gradients as the check left them (it coalesces a sparse float16 one in place).
        for param, grad, copy in [(param, param.grad, copy) for param, copy in fresh if param.grad is not None]:
            param.grad = None
            if copy.grad is None:
                grad = grad.to(copy.dtype)
                if inverse != 1.0:
                    grad.mul_(inverse)
                if grad.is_cuda:
                    grad.record_stream(optim_stream.cuda_stream(grad.device))
                copy.grad = grad
            else:
                copy.grad.add_(grad.to(copy.grad.dtype), alpha=inverse)
    return overflow


def _has_non_finite(params: Sequence[nn.Parameter]) -> bool:
    """Whether a gradient of ``params`` holds inf/NaN (torch's fused check, multiplier 1;
    the flags of every device summed on the first gradient's, so one host sync)."""
    grads = [param.grad for param in params if param.grad is not None]
    if not grads:
        return False
    one = torch.ones((), dtype=torch.float32, device=grads[0].device)
    found = unscale_grads_([{"params": list(params)}], one, allow_fp16=True)
    return bool(sum_found_inf(list(found.values()), grads[0].device).item())
