"""O1's casts outside the model: autocast for the thread that called ``initialize``.

apex's O1 patches torch's functions for the whole program: after ``amp.initialize`` a
patched function casts wherever it is called (say an evaluation loss computed from a plain
forward's low-precision output: apex's loss functions run in float32 there too). There are
two exceptions: the optimizer step, which apex runs with casts disabled, and autograd's
backward kernels, which the patches do not reach. :mod:`.model` autocasts the module's calls and
``forward_backward``'s ``loss_fn``. This module covers the rest of the program.
``initialize`` with O1 calls :func:`cast_everywhere`, which turns on autocast for the calling
thread (the main thread of a migrated script), with each model's device type and
low-precision type. Any later ``initialize`` turns it off again, and so does
:func:`stop_casting`. The exceptions hold as in apex: RoundPipe runs the backward with
autocast off, and runs step functions on the optimizer thread, which this thread's setting
does not reach.

Outside autocast contexts the cast cache stays off while O1 casts, so a parameter cast
there cannot outlive an in-place update. Inside the policy's contexts the cache is on, and
it is cleared when they exit.

Differences from apex: autocast's op lists replace apex's. The setting is thread-local: it
belongs to the thread that called ``initialize``, not to every thread.
"""

from __future__ import annotations

from typing import Iterable, Set, Tuple

import torch

__all__ = ["cast_everywhere", "stop_casting"]

_switched_on: Set[str] = set()  # device types whose autocast cast_everywhere turned on


def cast_everywhere(targets: Iterable[Tuple[str, torch.dtype]]) -> None:
    """Turn this thread's autocast on for each ``(device type, dtype)`` in ``targets``,
    and off for the device types that an earlier call turned on and ``targets`` leaves out.
    An empty ``targets`` is :func:`stop_casting`."""
    wanted = dict(targets)
    was_on = bool(_switched_on)
    for device_type in _switched_on - set(wanted):
        torch.set_autocast_enabled(device_type, False)
    _switched_on.intersection_update(wanted)
    for device_type, dtype in wanted.items():
        torch.set_autocast_dtype(device_type, dtype)
        torch.set_autocast_enabled(device_type, True)
        _switched_on.add(device_type)
    if was_on or _switched_on:
        torch.set_autocast_cache_enabled(not _switched_on)


def stop_casting() -> None:
    """Turn off the autocast that :func:`cast_everywhere` turned on (a no-op otherwise)."""
    cast_everywhere(())
