"""apex's function-casting API: ``amp.float_function``/``half_function``/``bfloat16_function``/
``promote_function`` and ``amp.register_*_function(module, name)``.

What apex does (shared/reference/apex_amp_behaviour.md §6.3 I): each decorator returns a
wrapper that, *while O1's casting is active* (after ``initialize`` with
``patch_torch_functions``, outside ``disable_casts``), casts the function's floating tensor
arguments (top-level positional and keyword arguments, and lists/tuples of tensors) and
then calls it; otherwise it calls the function unchanged. Casts are to float32 (float), to
the low-precision type (half, bfloat16), or, for promote, to float32 when the arguments mix
the low-precision type with float32 (a single type: unchanged; other mixes raise
``NotImplementedError``, as apex). Only the inputs are cast: O1's casting of the ops the
function calls stays on inside it. ``register_*_function`` records ``(module, name)``
(``ValueError`` when the module has no such attribute); the next ``initialize`` with O1
replaces ``module.name`` by the wrapper. Registrations are applied once.

Here "O1's casting is active" means: the latest :func:`roundpipe.compat.initialize` had
``patch_torch_functions`` (and ``enabled``). Differences from apex:

* CPU tensors are cast too (apex casts CUDA tensors only), and the low-precision type of
  ``half_function`` is that of O1's autocast for the tensor's device: float16, bfloat16 on
  CPU (:func:`low_precision_dtype`), the choice :mod:`roundpipe.compat.model` makes for O1;
* no cast cache (apex caches the half copies of weights within an iteration; the values
  are the same);
* ``torch.amp.custom_fwd(cast_inputs=...)`` is not the same thing: it is meant for
  ``autograd.Function.forward`` (it writes attributes onto its first argument), casts
  only while autocast is enabled, and turns autocast off inside the function.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, List, Optional, Set, Tuple

import torch

__all__ = [
    "activate_casting",
    "bfloat16_function",
    "float_function",
    "half_function",
    "low_precision_dtype",
    "promote_function",
    "register_bfloat16_function",
    "register_float_function",
    "register_half_function",
    "register_promote_function",
]

_active = False  # O1's casting, as the latest initialize set it
_registered: List[Tuple[Any, str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = []

#: A cast target: a dtype, or None for "the low-precision type of the tensor's device".
_Target = Optional[torch.dtype]


def low_precision_dtype(device_type: str) -> torch.dtype:
    """O1's low-precision type on ``device_type``: float16, bfloat16 on CPU (whose autocast
    has bfloat16 as its low-precision type)."""
    return torch.bfloat16 if device_type == "cpu" else torch.float16


def activate_casting(active: bool) -> None:
    """Called by ``initialize``: O1's casting on or off; on applies the registrations."""
    global _active
    _active = active
    while active and _registered:
        module, name, wrap = _registered.pop(0)
        setattr(module, name, wrap(getattr(module, name)))


def _cast(value: Any, target: _Target) -> Any:
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            return value
        return value.to(target if target is not None else low_precision_dtype(value.device.type))
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, target) for v in value)
    return value


def _casting(fn: Callable[..., Any], target: _Target) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _active:
            return fn(*args, **kwargs)
        return fn(*(_cast(a, target) for a in args), **{k: _cast(v, target) for k, v in kwargs.items()})

    return wrapper


def _floating_dtypes(values: List[Any]) -> Set[torch.dtype]:
    found: Set[torch.dtype] = set()
    for value in values:
        items = value if isinstance(value, (list, tuple)) else [value]
        found |= {t.dtype for t in items if isinstance(t, torch.Tensor) and t.is_floating_point()}
    return found


def float_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its floating tensor arguments cast to float32 under O1."""
    return _casting(fn, torch.float32)


def half_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its floating tensor arguments cast to O1's low-precision type under O1."""
    return _casting(fn, None)


def bfloat16_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its floating tensor arguments cast to bfloat16 under O1."""
    return _casting(fn, torch.bfloat16)


def promote_function(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with mixed low-precision/float32 arguments all cast to float32 under O1."""
    widened = _casting(fn, torch.float32)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not _active:  # outside O1: no scan of the arguments
            return fn(*args, **kwargs)
        dtypes = _floating_dtypes([*args, *kwargs.values()])
        if len(dtypes) <= 1:
            return fn(*args, **kwargs)
        if len(dtypes) == 2 and torch.float32 in dtypes and dtypes & {torch.float16, torch.bfloat16}:
            return widened(*args, **kwargs)
        raise NotImplementedError(f"Do not know how to handle these types to promote: {sorted(map(str, dtypes))}")

    return wrapper


def _register(module: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")
    _registered.append((module, name, wrap))


def register_float_function(module: Any, name: str) -> None:
    """``module.name`` becomes a :func:`float_function` at the next O1 ``initialize``."""
    _register(module, name, float_function)


def register_half_function(module: Any, name: str) -> None:
    """``module.name`` becomes a :func:`half_function` at the next O1 ``initialize``."""
    _register(module, name, half_function)


def register_bfloat16_function(module: Any, name: str) -> None:
    """``module.name`` becomes a :func:`bfloat16_function` at the next O1 ``initialize``."""
    _register(module, name, bfloat16_function)


def register_promote_function(module: Any, name: str) -> None:
    """``module.name`` becomes a :func:`promote_function` at the next O1 ``initialize``."""
    _register(module, name, promote_function)
