"""``apex.amp`` as documented (shared/reference/apex_amp_behaviour.md §1-§4), reduced to what
the tests and the parity matrix use: initialize (O0-O3 property table, num_losses, bounds),
scale_loss (the short cut, per-block unscale with the stash tables, step patching),
master_params, state dicts; for the projects in tests/migrate_projects the
function-casting decorators and registrations. CPU tensors are accepted (no CUDA checks). Written from the
spec in plain torch; it never imports roundpipe.

O1 on CPU: real apex does no casting on CPU tensors. This stand-in uses CPU autocast
(bfloat16) instead, the CPU analogue roundpipe.compat chose for O1, so an O1 script and its
migration can be compared on CPU. Like apex's patches of torch's functions, the casting covers
the whole program from ``initialize`` on, in the calling thread. It is off while a ``scale_loss``
block runs, so the backward runs outside it (apex's patches do not reach backward kernels),
and off inside ``optimizer.step`` (apex runs the step with casts disabled). The
function-casting decorators and registrations use bfloat16 as O1's low-precision type for
the same reason.

Arithmetic is apex's Python fallback: the scaled loss is ``loss.float() * S``; a new
gradient is widened and multiplied by the Python float ``1/S``; a gradient meeting a
stashed one is ``stash.add_(new, alpha=1/S)``. Overflow is checked element by element on
the incoming gradients (the fused kernel's test).
"""

import contextlib
import functools
import types

import torch
from torch.nn.modules.batchnorm import _BatchNorm

_amp_state = types.SimpleNamespace(loss_scalers=[], master_weights=False, casting=False)

_LEVELS = {  # cast_model_type, keep_batchnorm_fp32, master_weights, loss_scale
    "O0": (torch.float32, None, False, 1.0),
    "O1": (None, None, None, "dynamic"),
    "O2": (torch.float16, True, True, "dynamic"),
    "O3": (torch.float16, False, False, 1.0),
}


class LossScaler:
    """apex's LossScaler: §1.1 constructor, §1.2 ``update_scale``."""

    def __init__(self, loss_scale, min_loss_scale=None, max_loss_scale=2.0**24):
        self.dynamic = loss_scale == "dynamic"
        self._loss_scale = min(max_loss_scale, 2.0**16) if self.dynamic else loss_scale
        self._min_loss_scale = min_loss_scale
        self._max_loss_scale = max_loss_scale
        self._scale_seq_len = 2000
        self._unskipped = 0

    def loss_scale(self):
        return self._loss_scale

    def update_scale(self, overflow):
        if overflow and self.dynamic:
            half = self._loss_scale / 2.0
            self._loss_scale = max(self._min_loss_scale, half) if self._min_loss_scale else half
            self._unskipped = 0
            should_skip = True
        else:
            self._unskipped += 1
            should_skip = False
        if self.dynamic and self._unskipped == self._scale_seq_len:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip


def initialize(
    models,
    optimizers=None,
    enabled=True,
    opt_level="O1",
    cast_model_type=None,
    keep_batchnorm_fp32=None,
    master_weights=None,
    loss_scale=None,
    num_losses=1,
    verbosity=1,
    min_loss_scale=None,
    max_loss_scale=2.0**24,
    patch_torch_functions=None,
    **_,
):
    _close_casts()
    level = _LEVELS[opt_level]
    casting = opt_level == "O1" if patch_torch_functions is None else bool(patch_torch_functions)
    cast = level[0] if cast_model_type is None else cast_model_type
    keep_bn = level[1] if keep_batchnorm_fp32 is None else keep_batchnorm_fp32
    masters = level[2] if master_weights is None else master_weights
    scale = level[3] if loss_scale is None else loss_scale
    scale = scale if scale == "dynamic" else float(scale)
    model_list = models if isinstance(models, list) else [models]
    optimizer_list = [] if optimizers is None else (optimizers if isinstance(optimizers, list) else [optimizers])
    if cast:
        for model in model_list:
            _convert(model, cast, keep_bn)
            model.forward = _casting_forward(model.forward, cast)
    _amp_state.casting = casting
    if casting:
        while _registered:
            module, name, wrap = _registered.pop(0)
            setattr(module, name, wrap(getattr(module, name)))
    for optimizer in optimizer_list:
        _process_optimizer(optimizer, masters)
        if casting:
            optimizer.step = _without_casts(optimizer.step)
    if casting:
        _open_casts()
    _amp_state.master_weights = bool(masters)
    _amp_state.loss_scalers = [LossScaler(scale, min_loss_scale, max_loss_scale) for _ in range(num_losses)]
    return models if optimizers is None else (models, optimizers)


def _convert(model, dtype, keep_batchnorm_fp32):
    for module in model.modules():
        if keep_batchnorm_fp32 and isinstance(module, _BatchNorm) and module.affine:
            continue
        for tensor in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if tensor.is_floating_point():
                tensor.data = tensor.data.to(dtype)


def _casting_forward(forward, dtype):
    def cast(value, to):
        return value.to(to) if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    def patched(*args, **kwargs):
        output = forward(*(cast(a, dtype) for a in args), **{k: cast(v, dtype) for k, v in kwargs.items()})
        return cast(output, torch.float32)

    return patched


_casts = types.SimpleNamespace(open=False)  # whether O1's casts are on


def _open_casts():
    """O1's casts for the program, as CPU autocast in this stand-in (module docstring): the
    thread's autocast switched on, not a context entered, so that autocast contexts of the
    program still clear their cast cache at their exit; no cache outside them."""
    if not _casts.open:
        torch.set_autocast_dtype("cpu", torch.bfloat16)
        torch.set_autocast_enabled("cpu", True)
        torch.set_autocast_cache_enabled(False)
        _casts.open = True


def _close_casts():
    """No O1 casts from now on (until ``_open_casts``)."""
    if _casts.open:
        torch.set_autocast_enabled("cpu", False)
        torch.set_autocast_cache_enabled(True)
        _casts.open = False


@contextlib.contextmanager
def _casts_suspended():
    """O1's casts off inside the block, back on after it when O1 casts."""
    _close_casts()
    try:
        yield
    finally:
        if _amp_state.casting:
            _open_casts()


def _without_casts(step):
    """apex's O1 wraps every optimizer's step so that it runs with casts disabled."""

    @functools.wraps(step)
    def patched(*args, **kwargs):
        with torch.autocast("cpu", enabled=False):
            return step(*args, **kwargs)

    return patched


def _process_optimizer(optimizer, master_weights):
    """§3.6: fp32 masters replace fp16 params in the param groups, built lazily, from the
    model's fp16 weights, at the first ``scale_loss`` (``_lazy_init``); the patched step
    copies them back and drops their grads."""
    stash = types.SimpleNamespace(already_patched=False, pairs=[], masters=master_weights, built=False)
    optimizer._amp_stash = stash
    if not master_weights:
        return
    original_step = optimizer.step

    def step(closure=None):
        _lazy_init(optimizer)
        result = original_step()
        with torch.no_grad():
            for model_param, master in stash.pairs:
                model_param.copy_(master)
        for _, master in stash.pairs:
            master.grad = None
        return result

    optimizer.step = step


def _lazy_init(optimizer):
    """Build the fp32 masters once, from the fp16 params the param groups hold now."""
    stash = optimizer._amp_stash
    if not stash.masters or stash.built:
        return
    stash.built = True
    for group in optimizer.param_groups:
        for index, param in enumerate(group["params"]):
            if param.dtype == torch.float16:
                master = param.detach().clone().float().requires_grad_()
                group["params"][index] = master
                stash.pairs.append((param, master))


def master_params(optimizer):
    for group in optimizer.param_groups:
        yield from group["params"]


def _params_and_masters(optimizer):
    """(model param, the param the optimizer steps) for every param of the optimizer."""
    model_of = {id(master): param for param, master in optimizer._amp_stash.pairs}
    return [(model_of.get(id(p), p), p) for p in master_params(optimizer)]


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0):
    with _casts_suspended():
        yield from _scale_loss_block(loss, optimizers, loss_id)


def _scale_loss_block(loss, optimizers, loss_id):
    scaler = _amp_state.loss_scalers[loss_id]
    optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
    if not _amp_state.master_weights and not scaler.dynamic and scaler.loss_scale() == 1.0:
        yield loss.float()  # §2 step 5: the short cut
        return
    for optimizer in optimizers:
        _lazy_init(optimizer)
    pairs = [pair for opt in optimizers for pair in _params_and_masters(opt)]
    stashed = {}
    for param, stepped in pairs:  # prepare: model grads None, same-dtype grads stashed
        if param is stepped:
            stashed[id(param)] = param.grad
        param.grad = None
    yield loss.float() * scaler.loss_scale()
    inverse = 1.0 / scaler.loss_scale()
    new = [param.grad for param, _ in pairs if param.grad is not None]
    overflow = scaler.dynamic and any(not torch.isfinite(g).all() for g in new)
    with torch.no_grad():
        for param, stepped in pairs:
            grad = param.grad
            old = stashed.get(id(param)) if param is stepped else stepped.grad
            if grad is None:
                if param is stepped:
                    param.grad = old
                continue
            if old is None:
                grad = grad.float() if param is not stepped else grad
                if inverse != 1.0:
                    grad.mul_(inverse)
                stepped.grad = grad
            else:
                old.add_(grad.to(old.dtype), alpha=inverse)
                stepped.grad = old
    if scaler.update_scale(overflow):
        for optimizer in optimizers:
            if not optimizer._amp_stash.already_patched:
                _patch_skip(optimizer)


def _patch_skip(optimizer):
    """§1.6: the next step does nothing (and drops the masters' grads)."""
    original = optimizer.step

    def skip_step(closure=None):
        for _, master in optimizer._amp_stash.pairs:
            master.grad = None
        optimizer.step = original
        optimizer._amp_stash.already_patched = False

    optimizer.step = skip_step
    optimizer._amp_stash.already_patched = True


def state_dict():
    return {
        f"loss_scaler{i}": {"loss_scale": s._loss_scale, "unskipped": s._unskipped}
        for i, s in enumerate(_amp_state.loss_scalers)
    }


def load_state_dict(state):
    entries = [entry for key, entry in state.items() if "loss_scaler" in key]
    for scaler, entry in zip(_amp_state.loss_scalers, entries):
        scaler._loss_scale = entry["loss_scale"]
        scaler._unskipped = entry["unskipped"]


# ----------------------------------------------------------- function casting (apex §6)
# apex's wrappers cast only while O1's casting is active (after initialize with
# patch_torch_functions); registrations made before initialize are applied by it. The
# low-precision type is bfloat16 here, the O1 type of this stand-in (see the module docstring).
_registered = []  # (module, name, wrapper factory) waiting for initialize


def _cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _cast_args(fn, dtype):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not getattr(_amp_state, "casting", False):
            return fn(*args, **kwargs)
        return fn(*[_cast(a, dtype) for a in args], **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return wrapper


def _promote_args(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        values = [*args, *kwargs.values()]
        dtypes = {v.dtype for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()}
        if not getattr(_amp_state, "casting", False) or len(dtypes) <= 1:
            return fn(*args, **kwargs)
        if dtypes != {torch.bfloat16, torch.float32}:
            raise NotImplementedError(f"Do not know how to handle these types to promote: {dtypes}")
        return fn(*[_cast(a, torch.float32) for a in args], **{k: _cast(v, torch.float32) for k, v in kwargs.items()})

    return wrapper


def float_function(fn):
    """Decorator: under O1, ``fn`` gets its floating tensor arguments cast to fp32."""
    return _cast_args(fn, torch.float32)


def half_function(fn):
    """Decorator: under O1, ``fn`` gets its floating tensor arguments in O1's low precision."""
    return _cast_args(fn, torch.bfloat16)


def bfloat16_function(fn):
    return _cast_args(fn, torch.bfloat16)


def promote_function(fn):
    """Decorator: under O1, mixed-precision floating arguments are all cast to fp32."""
    return _promote_args(fn)


def _register(module, name, wrap):
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    _registered.append((module, name, wrap))


def register_float_function(module, name):
    _register(module, name, float_function)


def register_half_function(module, name):
    _register(module, name, half_function)


def register_bfloat16_function(module, name):
    _register(module, name, bfloat16_function)


def register_promote_function(module, name):
    _register(module, name, promote_function)
