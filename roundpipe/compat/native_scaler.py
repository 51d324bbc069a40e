"""A RoundPipe-aware drop-in for timm's ``NativeScaler`` loss-scaler wrapper.

timm's ``timm.utils.NativeScaler`` (also ``timm.utils.cuda.NativeScaler``) cannot be
rewritten by roundpipe-migrate, since it is library code. :class:`NativeScaler` keeps its
interface (``state_dict_key``, ``__call__(loss, optimizer, clip_grad=None, clip_mode="norm",
parameters=None, create_graph=False, need_update=True)``, ``state_dict``/``load_state_dict``)
and steps a RoundPipe model in the autograd form::

    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=...)
    loss_scaler = roundpipe.compat.NativeScaler(model=model)
    ...
    loss_scaler(loss, optimizer, clip_grad=1.0, parameters=model.optim_parameters())

It never imports timm. One difference: timm's ``clip_mode="agc"`` (adaptive gradient
clipping, a timm function) is not available and raises ``ValueError``.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, Optional, Union

import torch

from ..grad_scaler import GradScaler
from ..runtime import RoundPipe

__all__ = ["NativeScaler"]

Parameters = Union[torch.Tensor, Iterable[torch.Tensor]]


class NativeScaler:
    """timm's ``NativeScaler`` for a RoundPipe model: a :class:`roundpipe.GradScaler` that
    scales the loss and runs the backward on the calling thread, and on update steps unscales,
    clips, steps the optimizer inside ``model.step`` and updates the scale.

    Thread contract: construct it and call it on the main thread. The backward runs there
    (RoundPipe's forward is differentiable; the gradients accumulate in the model until
    ``model.step`` hands them to the optimizer copies). ``unscale_``, clipping and the
    optimizer step run in the step function on the optimizer thread, so ``parameters``
    must be the optimizer copies (``model.optim_parameters()``); ``update`` runs on the main
    thread after ``model.step``. With ``is_async=True`` (the default) the call returns while
    the step may still run, and the scale follows one iteration late (as upstream
    RoundPipe); with ``is_async=False`` the step is waited for and the scale sequence is
    torch's, so a loop with this class reproduces the same loop with timm's class bit for
    bit. ``state_dict``/``load_state_dict`` are torch's GradScaler state (same keys, so
    checkpoints written with timm's class load here and back).

    Args:
        device: the device type of the scaler (timm's argument).
        model: the RoundPipe model whose optimizer copies the optimizer steps.
        is_async: whether ``model.step`` and ``update`` return before the step finished.
    """

    state_dict_key = "amp_scaler"

    def __init__(self, device: str = "cuda", *, model: RoundPipe, is_async: bool = True) -> None:
        if not isinstance(model, RoundPipe):
            raise TypeError(f"NativeScaler steps a RoundPipe model, got {type(model).__name__}")
        self._model = model
        self._is_async = is_async
        self._scaler = GradScaler(device)

    def __call__(
        self,
        loss: torch.Tensor,
        optimizer: torch.optim.Optimizer,
        clip_grad: Optional[float] = None,
        clip_mode: str = "norm",
        parameters: Optional[Parameters] = None,
        create_graph: bool = False,
        need_update: bool = True,
    ) -> None:
        """Scale ``loss`` and backpropagate; when ``need_update``, unscale, clip the
        ``parameters`` (``clip_mode`` ``"norm"`` or ``"value"``) by ``clip_grad``, step
        ``optimizer`` (skipped on inf/NaN gradients) and update the scale. Main thread.

        Raises:
            ValueError: an unknown ``clip_mode`` (also timm's ``"agc"``), before any work.
        """
        if clip_grad is not None and clip_mode not in ("norm", "value"):
            raise ValueError(f"Unknown clip mode ({clip_mode}); roundpipe.compat.NativeScaler clips by norm or value")
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if not need_update:
            return

        def step_fn() -> None:
            if clip_grad is not None:
                if parameters is None:
                    raise ValueError("NativeScaler: clip_grad needs the parameters to clip")
                self._scaler.unscale_(optimizer)
                if clip_mode == "norm":
                    torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
                else:
                    torch.nn.utils.clip_grad_value_(parameters, clip_grad)
            self._scaler.step(optimizer)

        self._model.step(step_fn, is_async=self._is_async)
        self._scaler.update(is_async=self._is_async)

    def state_dict(self) -> Dict[str, Any]:
        """The scaler's state (torch's GradScaler keys). Main thread."""
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (or timm's). Main thread."""
        self._scaler.load_state_dict(state_dict)
