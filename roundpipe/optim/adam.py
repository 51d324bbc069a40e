"""roundpipe.optim.Adam: upstream RoundPipe's Adam signature, torch's numerics."""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple, Union

import torch

__all__ = ["Adam"]


class Adam(torch.optim.Adam):
    """``torch.optim.Adam`` with upstream RoundPipe's signature and defaults.

    Results are bit-for-bit those of ``torch.optim.Adam`` given the same flags on the same
    device. With ``foreach`` and ``fused`` both left as None, the multi-tensor (foreach)
    implementation is chosen on every device: on CUDA that is torch's own default, on CPU it
    is faster than torch's per-tensor default and gives the same bits (checked by the tests
    for weight decay, decoupled weight decay, amsgrad and maximize). ``fused=True`` works with
    ``GradScaler.step`` through torch's fused-optimizer protocol (no host sync).

    Unlike upstream RoundPipe 0.1.1 (a JIT-compiled CPU kernel, fp32 only, close but never
    bit-exact), it needs no compiler and accepts every dtype and device torch's Adam does.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: Union[float, torch.Tensor] = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        *,
        foreach: Optional[bool] = None,
        maximize: bool = False,
        capturable: bool = False,
        differentiable: bool = False,
        fused: Optional[bool] = None,
        decoupled_weight_decay: bool = False,
    ) -> None:
        if foreach is None and not fused and not differentiable:
            foreach = True
        extra = {}
        if decoupled_weight_decay:  # torch releases before 2.6 lack the keyword
            extra["decoupled_weight_decay"] = True
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
            foreach=foreach,
            maximize=maximize,
            capturable=capturable,
            differentiable=differentiable,
            fused=fused,
            **extra,
        )
