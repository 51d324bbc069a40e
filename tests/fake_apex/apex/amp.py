"""``apex.amp`` as documented (shared/reference/apex_amp_behaviour.md §1-§4), reduced to
what the parity matrix uses: initialize, scale_loss, master_params, state dicts; and for the
projects in tests/migrate_projects the function-casting decorators and registrations."""

import contextlib
import functools
import types

import torch

_amp_state = types.SimpleNamespace(loss_scalers=[])


class LossScaler:
    """apex's dynamic rule: halve on overflow, double after ``_scale_seq_len`` clean steps,
    capped at 2**24."""

    def __init__(self):
        self._loss_scale = 2.0**16
        self._scale_seq_len = 2000
        self._unskipped = 0
        self._max_loss_scale = 2.0**24

    def loss_scale(self):
        return self._loss_scale

    def update_scale(self, overflow):
        if overflow:
            self._loss_scale /= 2.0
            self._unskipped = 0
        else:
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return overflow


def initialize(models, optimizers=None, opt_level="O1", verbosity=1, **_):
    _amp_state.loss_scalers = [LossScaler()]
    return models if optimizers is None else (models, optimizers)


def master_params(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]


@contextlib.contextmanager
def scale_loss(loss, optimizers):
    scaler = _amp_state.loss_scalers[0]
    optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
    yield loss.float() * scaler.loss_scale()
    grads = [p.grad for opt in optimizers for p in master_params(opt) if p.grad is not None]
    overflow = any(not torch.isfinite(g).all() for g in grads)
    if not overflow:
        for g in grads:
            g.mul_(1.0 / scaler.loss_scale())
    if scaler.update_scale(overflow):
        for opt in optimizers:
            def skip(*args, _opt=opt, _step=opt.step, **kwargs):
                _opt.step = _step  # skip this one step only
            opt.step = skip


def state_dict():
    return {f"loss_scaler{i}": {"loss_scale": s._loss_scale, "unskipped": s._unskipped}
            for i, s in enumerate(_amp_state.loss_scalers)}


def load_state_dict(state):
    for scaler, entry in zip(_amp_state.loss_scalers, state.values()):
        scaler._loss_scale = entry["loss_scale"]
        scaler._unskipped = entry["unskipped"]


# ----------------------------------------------------------- function casting (apex §6)
_registered = []  # (module, name, cast): recorded only; the stand-in patches nothing


def _cast_args(fn, dtype):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        def cast(value):
            return value.to(dtype) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

        return fn(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})

    return wrapper


def float_function(fn):
    """Decorator: run ``fn`` with its floating tensor arguments cast to fp32."""
    return _cast_args(fn, torch.float32)


def half_function(fn):
    """Decorator: run ``fn`` with its floating tensor arguments cast to fp16."""
    return _cast_args(fn, torch.float16)


def register_float_function(module, name):
    _registered.append((module, name, "float"))


def register_half_function(module, name):
    _registered.append((module, name, "half"))


def register_promote_function(module, name):
    _registered.append((module, name, "promote"))
