"""roundpipe.compat: the run-time layer for scripts migrated from NVIDIA apex.amp (and the
loss-scaler wrapper of timm, :class:`NativeScaler`, in :mod:`.native_scaler`).

It never imports apex. A migrated script calls :func:`initialize` as it called
``amp.initialize`` (same signature, opt levels O0-O3 with apex's property table and
override checks, same return shapes) and gets RoundPipe models and its own optimizers,
now stepping RoundPipe's optimizer copies; the loss scaling apex did inside
``amp.scale_loss`` is done by one apex-style loss scaler per loss
(:class:`~roundpipe.compat.loss_scaler.AmpLossScaler`, same rule, same arithmetic)::

    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O2")
    scaler = roundpipe.compat.loss_scaler()
    loss = model.forward_backward(input_args=(x,), label=y,
                                  loss_fn=lambda out, y: scaler.scale(criterion(out, y)))
    ...
    torch.save({"amp": roundpipe.compat.state_dict(), ...}, path)

Modules, one job each: :mod:`.properties` (the table and its checks), :mod:`.convert`
(model weights), :mod:`.casting` (inputs and outputs), :mod:`.model` (the RoundPipe
subclass), :mod:`.optimizers` (optimizers onto the copies, ``master_params``),
:mod:`.loss_scaler` (apex's LossScaler and the ``scale_loss`` block), :mod:`.master_grads`
(a block's gradients unscaled onto the copies), :mod:`.steps` (skipped steps),
:mod:`.functions` (``float_function``... and the ``register_*_function`` calls),
:mod:`.global_casts` (O1's autocast for the rest of the calling thread),
:mod:`.scaler` (the loss scalers of the amp state and apex's state dict), :mod:`.frontend`
(``initialize``). Each module's docstring lists where it deliberately differs from apex.
"""

from .frontend import initialize
from .functions import (
    bfloat16_function,
    float_function,
    half_function,
    promote_function,
    register_bfloat16_function,
    register_float_function,
    register_half_function,
    register_promote_function,
)
from .native_scaler import NativeScaler
from .optimizers import master_params
from .properties import OPT_LEVELS
from .scaler import load_state_dict, loss_scaler, state_dict

__all__ = [
    "NativeScaler",
    "OPT_LEVELS",
    "bfloat16_function",
    "float_function",
    "half_function",
    "initialize",
    "load_state_dict",
    "loss_scaler",
    "master_params",
    "promote_function",
    "register_bfloat16_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
    "state_dict",
]
