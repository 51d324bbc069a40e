"""apex's optimizer-step protocol: a step skipped after an overflow, masters' grads dropped.

When a ``scale_loss`` block overflows, apex replaces the ``step`` of every optimizer of the
block for one call: the next ``optimizer.step()`` does nothing, however many blocks come
before it, so a step is skipped when any loss of the iteration overflowed. With master
weights apex also drops the float32 master gradients after every step, skipped or not
(they are rebuilt by the next block). :class:`OptimizerSteps` keeps that state for the
optimizers of one ``initialize`` call; :meth:`AmpLossScaler.step
<roundpipe.compat.loss_scaler.AmpLossScaler.step>` runs the step through it.

Thread contract: :meth:`~OptimizerSteps.skip_next_step` runs on the main thread while no
optimizer job runs (a block exit waits for the optimizer first); :meth:`~OptimizerSteps.step`
runs on the optimizer thread. A lock guards the shared set all the same.
"""

from __future__ import annotations

import threading
from typing import Any, Collection, Iterable, Optional, Sequence

import torch

__all__ = ["OptimizerSteps"]


class OptimizerSteps:
    """The skip flags and master-gradient lifecycle of the optimizers of one initialize call.

    Args:
        optimizers: the optimizers ``initialize`` returned.
        masters: ids of the copies that are float32 masters of lower-precision model
            parameters (their gradients are dropped after every step, as apex's).
    """

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], masters: Collection[int]) -> None:
        self._optimizers = list(optimizers)
        self._masters = frozenset(masters)
        self._skip_next: set = set()
        self._lock = threading.Lock()

    def skip_next_step(self, copies: Iterable[torch.Tensor]) -> None:
        """Make the next step of every optimizer holding one of ``copies`` a no-op."""
        ids = {id(copy) for copy in copies}
        with self._lock:
            for optimizer in self._optimizers:
                if any(id(p) in ids for group in optimizer.param_groups for p in group["params"]):
                    self._skip_next.add(id(optimizer))

    def will_skip(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether the next step of ``optimizer`` is skipped."""
        with self._lock:
            return id(optimizer) in self._skip_next

    def step(self, optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> Optional[Any]:
        """``optimizer.step(*args, **kwargs)``, or nothing when the step is skipped (the
        flag is then cleared); the masters' gradients are dropped either way. Returns the
        step's return value (None when skipped)."""
        with self._lock:
            skipped = id(optimizer) in self._skip_next
            self._skip_next.discard(id(optimizer))
        result = None if skipped else optimizer.step(*args, **kwargs)
        for group in optimizer.param_groups:
            for param in group["params"]:
                if id(param) in self._masters:
                    param.grad = None
        return result
