"""OptimizerCtx: make ``RoundPipe.parameters()`` yield the optimizer copies on this thread."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Optional, Type

__all__ = ["OptimizerCtx", "optimizer_ctx_active"]

_state = threading.local()


def optimizer_ctx_active() -> bool:
    """True inside ``with OptimizerCtx():`` on the calling thread."""
    return getattr(_state, "depth", 0) > 0


class OptimizerCtx:
    """Context manager: inside it, on the thread that entered it, ``RoundPipe.parameters()``
    and ``named_parameters()`` (with ``recurse=True``) return the optimizer copies
    (``optim_parameters()``) instead of the model's own parameters.

    So an optimizer can be built as in plain PyTorch::

        with OptimizerCtx():
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    RoundPipe enters it around every step function on the optimizer thread. Unlike upstream
    RoundPipe 0.1.1 it nests safely: leaving an inner context keeps an outer one active.
    """

    def __enter__(self) -> None:
        _state.depth = getattr(_state, "depth", 0) + 1

    def __exit__(
        self,
        exc_type: Optional[Type[BaseException]],
        exc_value: Optional[BaseException],
        traceback: Optional[TracebackType],
    ) -> None:
        _state.depth -= 1
