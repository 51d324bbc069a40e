"""apex's LossScaler, one per loss, driven by the migrated (torch-style) training loop.

A migrated apex script scales its loss inside ``loss_fn`` (``scaler.scale(loss)``), runs
``model.forward_backward``, then ``model.step`` with ``scaler.step(optimizer)`` inside and
``scaler.update()`` after. :class:`AmpLossScaler` gives those calls apex's semantics:

* **The block.** A ``forward_backward`` of an :class:`~roundpipe.compat.model.AmpRoundPipe`
  in which this scaler scaled the loss is one apex ``scale_loss`` block. At its exit
  (:meth:`AmpLossScaler.end_block`) the gradients are unscaled onto the optimizer copies
  with the block's scale (:mod:`.master_grads`), overflow is checked on the block's
  gradients, and the scale is updated, all before the next block, as apex does at every
  ``scale_loss`` exit. An overflow makes the next step of the model's optimizers a no-op
  (:mod:`.steps`), so a step is skipped when any loss of the iteration overflowed.
* **The rule** (apex's ``update_scale``): dynamic: on overflow the scale halves, floored at
  ``min_loss_scale`` when that is truthy, and the counter restarts; otherwise the counter
  counts, and when it *equals* the window (2000) the scale doubles, capped at
  ``max_loss_scale``, and the counter restarts. The first scale is ``min(max_loss_scale,
  2**16)``; neither bound is applied anywhere else (a loaded scale outside them is kept).
  Static: the scale never changes and the counter counts every block.
* **Scale values** are Python numbers, as in apex: the loss is multiplied as
  ``loss.float() * S`` and gradients by the Python float ``1/S``, so a static 100.1 is
  reported as 100.1 and trains with float32(100.1), bit for bit apex's arithmetic.
* **apex's short cut.** Without master weights a static scale of 1.0 (O0, O3, O1 with
  ``loss_scale=1``) does nothing at all: ``scale`` returns ``loss.float()``, gradients
  accumulate in the model as plain RoundPipe does, and the counter stays. A scale loaded
  later (``load_state_dict``) ends the short cut, as in apex.

One deliberate difference: a static scale checks the block's gradients too and skips the
step when they are not finite (apex applies them, writing inf/NaN into the weights).
``skip_static_overflow = False`` gives apex's behaviour.

Thread contract: ``scale``, ``get_scale``, ``update``, ``end_block`` and the state-dict
methods run on the main thread; ``step``/``unscale_`` run inline on the optimizer thread
(inside a RoundPipe step function) or are queued there and waited for.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch

from .. import optim_stream
from .master_grads import Pair, unscale_block_
from .steps import OptimizerSteps

__all__ = ["AmpLossScaler", "ScaleLossBlock", "check_bounds", "current_block"]

Number = Union[int, float]
_INIT_SCALE = 2.0**16
_WINDOW = 2000


class AmpLossScaler:
    """apex's LossScaler for one loss (see the module docstring).

    Args:
        loss_scale: ``"dynamic"`` or a static number (kept as given: an int stays an int).
        min_loss_scale: dynamic floor applied when halving; falsy or non-positive: none.
        max_loss_scale: dynamic cap applied when growing, and to the first scale.
        steps: the skip flags of the optimizers of the ``initialize`` call.
        master_weights: apex's property (it decides the short cut).
        enabled: False (``initialize(enabled=False)``): everything passes through.

    Attributes keep apex's names, so code written against ``_amp_state.loss_scalers[k]``
    ports by hand: ``loss_scale()``, ``dynamic``, ``_loss_scale``, ``_unskipped``,
    ``_scale_seq_len`` (the window), ``_min_loss_scale``, ``_max_loss_scale``.
    ``skip_static_overflow`` (default True) makes a static scale skip steps whose
    gradients are not finite; False applies them, as apex does.

    Raises ``ValueError`` for bounds apex would accept but that make no sense
    (``max_loss_scale <= 0``, a floor above the cap).
    """

    def __init__(
        self,
        loss_scale: Union[str, Number],
        min_loss_scale: Optional[Number] = None,
        max_loss_scale: Number = 2.0**24,
        steps: Optional[OptimizerSteps] = None,
        master_weights: bool = False,
        enabled: bool = True,
    ) -> None:
        check_bounds(min_loss_scale, max_loss_scale)
        self.dynamic = loss_scale == "dynamic"
        self._loss_scale: Number = (
            min(max_loss_scale, _INIT_SCALE) if self.dynamic else loss_scale  # type: ignore[assignment]
        )
        self._min_loss_scale = min_loss_scale
        self._max_loss_scale = max_loss_scale
        self._scale_seq_len = _WINDOW
        self._unskipped = 0
        self._steps = steps if steps is not None else OptimizerSteps([], ())
        self._master_weights = bool(master_weights)
        self._enabled = bool(enabled)
        self._block_scale: Optional[Number] = None  # the latest block's scale, until update()
        self._siblings: List["AmpLossScaler"] = [self]
        self.skip_static_overflow = True

    def link(self, siblings: Sequence["AmpLossScaler"]) -> None:
        """Make ``update()`` end the iteration for every loss of ``siblings`` (initialize)."""
        self._siblings = list(siblings)

    # ---------------------------------------------------------------- apex's LossScaler
    def loss_scale(self) -> Number:
        """The current scale, as apex's ``LossScaler.loss_scale()`` (the next block's)."""
        return self._loss_scale

    def update_scale(self, overflow: bool) -> bool:
        """apex's rule for one block; returns whether the next step must be skipped."""
        if overflow and self.dynamic:
            halved = self._loss_scale / 2.0
            self._loss_scale = max(self._min_loss_scale, halved) if self._min_loss_scale else halved
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self.dynamic and self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return overflow

    def _short_cut(self) -> bool:
        return not self._master_weights and not self.dynamic and self._loss_scale == 1.0

    # ------------------------------------------------------------------- the block
    def scale(self, outputs: Any) -> Any:
        """``outputs.float() * S`` for a tensor, or a list/tuple of them (apex's scaled
        loss; an fp64 loss becomes fp32, as in apex). Inside an AmpRoundPipe
        ``forward_backward`` this makes the call an apex ``scale_loss`` block of this loss;
        outside one nothing unscales the resulting gradients (call it in ``loss_fn``).
        ``loss.float()`` under apex's short cut; ``outputs`` unchanged when disabled."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(value) for value in outputs)
        if not isinstance(outputs, torch.Tensor):
            raise ValueError("outputs must be a Tensor or a list/tuple of Tensors")
        if self._short_cut():
            return outputs.float()
        block = current_block()
        if block is not None:
            block.scaled_by(self)
        self._block_scale = None
        return outputs.float() * self._loss_scale

    def end_block(self, pairs: Sequence[Pair]) -> None:
        """apex's ``scale_loss`` exit for this loss: unscale the block's gradients onto the
        copies, update the scale, flag the step to skip on overflow. Main thread, with the
        optimizer idle (the caller waits for it)."""
        scale = self._loss_scale
        check = self.dynamic or self.skip_static_overflow
        overflow = unscale_block_(pairs, scale, check)
        if self.update_scale(overflow):
            self._steps.skip_next_step(copy for _, copy in pairs)
        self._block_scale = scale

    # ------------------------------------------------------- the migrated loop's calls
    def get_scale(self) -> Number:
        """The scale of this loss's latest block until ``update()`` ends the iteration (what
        the migrated loop divides the returned loss by); the current scale otherwise. 1.0
        when disabled."""
        if not self._enabled:
            return 1.0
        return self._loss_scale if self._block_scale is None else self._block_scale

    def unscale_(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing to do: apex unscaled every block at its exit already."""
        del optimizer

    def step(self, optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Optional[Any]:
        """``optimizer.step(*args, **kwargs)`` unless a block since the last step overflowed
        (then nothing; apex's patched step). With master weights the masters' gradients are
        dropped afterwards, as apex does. Inline on the optimizer thread; from the main
        thread run as the next optimizer job and waited for (inline when the optimizer is idle,
        as :func:`roundpipe.optim_stream.call` does; returns None). A closure is a ``RuntimeError``
        where apex refuses it (master weights, or a step to skip) and is passed on otherwise.
        Disabled: ``optimizer.step(*args, **kwargs)``."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        has_closure = bool(args) or kwargs.get("closure") is not None
        if has_closure and (self._master_weights or self._steps.will_skip(optimizer)):
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        if optim_stream.on_optim_stream():
            return self._steps.step(optimizer, args, kwargs)
        optim_stream.call(self._steps.step, optimizer, args, kwargs, reason="AmpLossScaler.step()")
        return None

    def update(self, new_scale: Optional[Number] = None, is_async: bool = True) -> None:
        """End the iteration for every loss (``get_scale`` reports the current scales
        again). apex updated each scale at its block's exit already, so ``is_async`` changes
        nothing; ``new_scale`` sets this loss's scale. Main thread."""
        del is_async
        if new_scale is not None:
            self._loss_scale = new_scale
        for scaler in self._siblings:
            scaler._block_scale = None

    def is_enabled(self) -> bool:
        """Whether the scaler scales at all: False for ``initialize(enabled=False)`` and
        under apex's short cut (static 1.0 without master weights: O0, O3)."""
        return self._enabled and not self._short_cut()

    def get_growth_interval(self) -> int:
        """apex's ``scale_window`` (2000; apex keeps it in ``_scale_seq_len``)."""
        return self._scale_seq_len

    def set_growth_interval(self, new_interval: int) -> None:
        """Set apex's ``scale_window`` (scripts wrote ``_scale_seq_len``)."""
        self._scale_seq_len = new_interval

    # -------------------------------------------------------------------- checkpoints
    def state_dict(self) -> Dict[str, Number]:
        """apex's entry: ``{"loss_scale": S, "unskipped": n}`` (1.0 and 0 when disabled)."""
        if not self._enabled:
            return {"loss_scale": 1.0, "unskipped": 0}
        return {"loss_scale": self._loss_scale, "unskipped": self._unskipped}

    def load_state_dict(self, entry: Mapping[str, Any]) -> None:
        """Take apex's entry as apex does: the scale (type kept, no bound applied) and the
        counter, for every configuration; ignored when disabled. A torch/roundpipe
        GradScaler state dict is read too (``scale``, ``_growth_tracker``,
        ``growth_interval``; its factors must be apex's 2 and 0.5, else ``ValueError``)."""
        if not self._enabled:
            return
        if "scale" in entry:
            if (entry.get("growth_factor", 2.0), entry.get("backoff_factor", 0.5)) != (2.0, 0.5):
                raise ValueError("apex's loss scaler grows by 2 and backs off by 0.5; the state dict has other factors")
            self._scale_seq_len = entry.get("growth_interval", self._scale_seq_len)
            entry = {"loss_scale": entry["scale"], "unskipped": entry["_growth_tracker"]}
        self._loss_scale = entry["loss_scale"]
        self._unskipped = entry["unskipped"]


class ScaleLossBlock:
    """One ``forward_backward`` of an AmpRoundPipe: records the loss scaler that scaled it.

    Use as a context manager around the forward/backward (main thread); :meth:`scaler`
    then names the scaler whose :meth:`AmpLossScaler.end_block` must run, if any.
    """

    _active = threading.local()

    def __init__(self) -> None:
        self._scaler: Optional[AmpLossScaler] = None

    def __enter__(self) -> "ScaleLossBlock":
        self._outer = getattr(ScaleLossBlock._active, "block", None)
        ScaleLossBlock._active.block = self
        return self

    def __exit__(self, *exc_info: Any) -> None:
        ScaleLossBlock._active.block = self._outer

    def scaled_by(self, scaler: AmpLossScaler) -> None:
        """Record ``scaler``; ``RuntimeError`` when another loss's scaler was used already
        (apex: one ``scale_loss`` block, one loss)."""
        if self._scaler is not None and self._scaler is not scaler:
            raise RuntimeError(
                "one forward_backward scaled losses of two loss ids; apex's "
                "scale_loss takes one loss: run one forward_backward per loss_id"
            )
        self._scaler = scaler

    @property
    def scaler(self) -> Optional[AmpLossScaler]:
        return self._scaler


def current_block() -> Optional[ScaleLossBlock]:
    """The block of the ``forward_backward`` running on this thread, if any."""
    return getattr(ScaleLossBlock._active, "block", None)


def check_bounds(min_loss_scale: Optional[Number], max_loss_scale: Number) -> None:
    """``ValueError`` for ``max_loss_scale <= 0`` (or not a number) and for a positive
    ``min_loss_scale`` above it (apex accepts both; neither trains sensibly)."""
    if not isinstance(max_loss_scale, (int, float)) or not max_loss_scale > 0:
        raise ValueError(f"max_loss_scale must be a positive number, got {max_loss_scale!r}")
    if min_loss_scale and min_loss_scale > max_loss_scale:
        raise ValueError(f"min_loss_scale ({min_loss_scale}) must not exceed max_loss_scale ({max_loss_scale})")
