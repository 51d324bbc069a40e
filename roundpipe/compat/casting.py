"""Casting the values that go into and come out of a model (apex's forward patch).

:func:`cast_floating` walks a value the way apex's ``applier`` does with its ``to_type``:

* a tensor: floating tensors become ``dtype``; integer, bool and complex tensors are kept;
* ``str``/``bytes``: kept;
* any other object with a ``.to`` attribute (custom batch classes, as apex documents):
  ``value.to(dtype)``, trusting the object to cast itself;
* a mapping: a plain ``dict`` (an ``OrderedDict`` loses its type, as in apex) with keys
  and values cast;
* a list or tuple: the same type with every element cast;
* anything else (ints, None, NumPy arrays, ...): kept.

Deliberate differences from apex: a namedtuple is rebuilt field by field (apex calls
``type(value)(generator)``, a ``TypeError`` for namedtuples); iterables other than lists
and tuples are kept (apex rebuilds every iterable the same way, which fails for most of
them); CPU tensors are cast without apex's "An input tensor was not cuda." warning.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["cast_floating"]


def cast_floating(value: Any, dtype: torch.dtype) -> Any:
    """``value`` with its floating tensors cast to ``dtype``, following the rules above.

    Tensors already in ``dtype`` are returned as they are (``Tensor.to`` makes no copy);
    containers are always rebuilt.
    """
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (str, bytes)):
        return value
    if hasattr(value, "to"):
        return value.to(dtype)
    if isinstance(value, Mapping):
        return {cast_floating(k, dtype): cast_floating(v, dtype) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(cast_floating(item, dtype) for item in value))
    if isinstance(value, (list, tuple)):
        return type(value)(cast_floating(item, dtype) for item in value)
    return value
