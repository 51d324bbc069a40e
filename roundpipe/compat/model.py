"""The RoundPipe model that ``roundpipe.compat.initialize`` returns.

:class:`AmpRoundPipe` is a :class:`roundpipe.RoundPipe` that applies a
:class:`ForwardPolicy` (what apex's opt level does around the model) to every call of the
wrapped module made by :meth:`~AmpRoundPipe.forward` and
:meth:`~AmpRoundPipe.forward_backward`:

1. cast the inputs (apex's forward patch, ``cast_model_type``: O0, O2, O3);
2. run the module under ``torch.autocast`` (O1's ``patch_torch_functions``);
3. cast the outputs (``cast_model_outputs``, float32 by default when inputs are cast).

``forward_backward`` also runs ``loss_fn`` under the same autocast, because apex's O1
patches the torch functions a loss calls too. A ``forward_backward`` whose ``loss_fn``
scaled its loss with a :class:`~roundpipe.compat.loss_scaler.AmpLossScaler` is one apex
``scale_loss`` block: at its end the gradients are unscaled onto the optimizer copies and
the scale is updated (:meth:`AmpLossScaler.end_block
<roundpipe.compat.loss_scaler.AmpLossScaler.end_block>`), as apex does at the block's exit.
A step whose forward stays on the main thread (``out = model(x)``, RoundPipe's autograd
form) gets the same exit from ``with model.scale_loss(loss, scaler) as scaled:
scaled.backward()`` (:meth:`AmpRoundPipe.scale_loss`).
Backward runs *outside* autocast: apex's patches do not reach autograd's backward kernels,
and torch autocast around a backward would recast the backward's own ops. Step functions
run with autocast off too, as apex runs the optimizer step with casts disabled. The rest of
the program casts through :mod:`.global_casts`.

The policy hooks into RoundPipe's per-microbatch calls (``_call_model``/``_call_loss``);
``model.model`` stays the user's module, unchanged: calling it directly bypasses the
policy (though not O1's thread-wide autocast), and its state dict keys are the usual ones.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Tuple

import torch
from torch import nn

from ..runtime import RoundPipe, _autocast_off
from .casting import cast_floating
from .functions import low_precision_dtype
from .loss_scaler import AmpLossScaler, ScaleLossBlock

__all__ = ["AmpRoundPipe", "ForwardPolicy", "autocast_target"]


@dataclass(frozen=True)
class ForwardPolicy:
    """What happens around each call of the wrapped module.

    Attributes:
        input_dtype: floating inputs are cast to it (:func:`cast_floating`); None: untouched.
        output_dtype: floating outputs are cast to it; None: untouched.
        autocast_device: device type for ``torch.autocast``; None: no autocast.
        autocast_dtype: the autocast dtype (used only with ``autocast_device``).
    """

    input_dtype: Optional[torch.dtype] = None
    output_dtype: Optional[torch.dtype] = None
    autocast_device: Optional[str] = None
    autocast_dtype: Optional[torch.dtype] = None

    def autocast(self) -> ContextManager[Any]:
        """``torch.autocast`` as the policy says, or a context that does nothing."""
        if self.autocast_device is None:
            return contextlib.nullcontext()
        return torch.autocast(self.autocast_device, dtype=self.autocast_dtype)

    def call(self, forward: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``forward(*args, **kwargs)`` with the inputs cast, under autocast, outputs cast."""
        if self.input_dtype is not None:
            args = cast_floating(args, self.input_dtype)
            kwargs = cast_floating(kwargs, self.input_dtype)
        with self.autocast():
            output = forward(*args, **kwargs)
        if self.output_dtype is not None:
            output = cast_floating(output, self.output_dtype)
        return output


def _without_autocast(step_fn: Callable[..., Any]) -> Callable[..., Any]:
    """``step_fn`` run with every autocast of its thread switched off."""

    @functools.wraps(step_fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _autocast_off():
            return step_fn(*args, **kwargs)

    return run


def autocast_target(module: nn.Module) -> Tuple[str, torch.dtype]:
    """``(device type, dtype)`` for autocasting ``module`` as O1 does.

    The device type is that of the module's first parameter (or buffer; ``"cpu"`` when it
    has neither). The dtype is float16, as apex's O1, except on CPU, whose autocast
    supports bfloat16 as its low-precision type: there it is bfloat16 (apex's O1 does no
    casting at all on CPU tensors).
    """
    tensor: Optional[torch.Tensor] = next(module.parameters(), None)
    if tensor is None:
        tensor = next(module.buffers(), None)
    device_type = "cpu" if tensor is None else tensor.device.type
    return device_type, low_precision_dtype(device_type)


class AmpRoundPipe(RoundPipe):
    """A :class:`RoundPipe` whose module calls follow a :class:`ForwardPolicy`.

    Args:
        model: the module (already converted to its opt level's dtype).
        policy: the policy applied around every call of ``model``.
        optim_dtype, name: as :class:`RoundPipe`'s.
    """

    def __init__(
        self,
        model: nn.Module,
        policy: ForwardPolicy,
        optim_dtype: Optional[torch.dtype] = None,
        name: Optional[str] = None,
    ) -> None:
        # Set before RoundPipe.__init__: afterwards unknown attributes go to the module.
        self.amp_policy = policy
        self._blocks_run = False  # whether a scale_loss block has ended (apex's masters exist)
        super().__init__(model, optim_dtype=optim_dtype, name=name)

    def forward_backward(self, *args: Any, **kwargs: Any) -> Any:
        """:meth:`RoundPipe.forward_backward`, as one apex ``scale_loss`` block.

        When ``loss_fn`` scaled the loss with a compat loss scaler, the block's exit follows:
        wait for the optimizer (its copies receive the gradients), then unscale this
        block's gradients onto them and update that loss's scale. Nothing happens at the
        exit when the call raises, as in apex. Main thread.
        """
        with ScaleLossBlock() as block:
            result = super().forward_backward(*args, **kwargs)
        self._end_block(block)
        return result

    forward_backward.__signature__ = inspect.signature(RoundPipe.forward_backward)  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def scale_loss(self, loss: Any, scaler: AmpLossScaler) -> Iterator[Any]:
        """apex's ``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()`` for
        a loss computed from this model's (differentiable) forward on the main thread: the
        block yields ``scaler.scale(loss)``; its exit is the one :meth:`forward_backward`
        has (wait for the optimizer, unscale the block's gradients onto the copies, update
        the scale, flag the next step to skip on overflow). The block's body runs with
        autocast off, as apex suspends O1's casts inside ``scale_loss``. Nothing happens at
        the exit when the body raises, as in apex. Main thread."""
        with _autocast_off():
            with ScaleLossBlock() as block:
                scaled = scaler.scale(loss)
            yield scaled
        self._end_block(block)

    def _end_block(self, block: ScaleLossBlock) -> None:
        """The exit of a ``scale_loss`` block whose loss ``block`` recorded a scaler for."""
        if block.scaler is not None:
            self._wait_for_optimizer("a scale_loss block's exit (gradients to the copies)")
            block.scaler.end_block(self._copies.pairs())
            self._blocks_run = True

    def _keeps_masters_on_load(self) -> bool:
        """apex builds its float32 master weights once, from the float16 model weights, at
        the first ``scale_loss`` block, and never reads the model's weights again: weights
        loaded into the model after that (a resume in the middle of training) leave the
        masters as they are, and the next step writes the masters back over them. The
        copies here do the same; weights loaded before the first block replace them, as
        apex's masters are then built from the loaded weights. Parameters whose copy has
        their own dtype (no master: float32 batch norm in O2, every parameter in O1) take
        the loaded values in either case, as apex steps those parameters themselves."""
        return self._blocks_run

    def step(self, step_fn: Callable[..., Any], is_async: bool = True, *args: Any, **kwargs: Any) -> None:
        """:meth:`RoundPipe.step`, with ``step_fn`` run with autocast off, as apex's O1 runs
        the optimizer step with casts disabled (a step waited for at once may run on this
        thread, where O1 casts: :mod:`roundpipe.compat.global_casts`). Main thread."""
        super().step(_without_autocast(step_fn) if callable(step_fn) else step_fn, is_async, *args, **kwargs)

    def _call_model(self, args: tuple, kwargs: Dict[str, Any]) -> Any:
        """One microbatch through the module, with the policy's casting and autocast."""
        return self.amp_policy.call(self.model, *args, **kwargs)

    def _call_loss(self, loss_fn: Callable[[Any, Any], Any], outputs: Any, label: Any) -> Any:
        """``loss_fn`` under the policy's autocast (apex O1 patches the loss functions
        too); backward stays outside it."""
        with self.amp_policy.autocast():
            return loss_fn(outputs, label)

    def copy_map(self) -> Dict[nn.Parameter, nn.Parameter]:
        """``{trainable parameter of the module: its optimizer copy}`` (creates the copies)."""
        return dict(self._copies.pairs())
