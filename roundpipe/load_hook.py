"""The ``load_state_dict`` post-hook RoundPipe puts on the module it wraps.

Loading weights into the wrapped module must refresh the optimizer copies
(:meth:`roundpipe.runtime.RoundPipe._weights_loaded`). A deep copy of that module (the EMA or
averaged copy a trainer builds from ``model.model``: torch's ``AveragedModel``, timm's
``ModelEmaV2``) is a plain module that RoundPipe does not manage, so its copy of the hook does
nothing; it neither drags a copy of the RoundPipe object along nor refreshes anything. The
same holds for the module pickled whole and loaded again.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

from torch import nn

__all__ = ["WeightsLoadedHook"]


class WeightsLoadedHook:
    """Calls ``on_load(module, incompatible_keys)`` after a load into the wrapped module; a
    deep copy of it calls nothing."""

    __slots__ = ("_on_load",)

    def __init__(self, on_load: Optional[Callable[[nn.Module, Any], None]]) -> None:
        self._on_load = on_load

    def __call__(self, module: nn.Module, incompatible_keys: Any) -> None:
        if self._on_load is not None:
            self._on_load(module, incompatible_keys)

    def __reduce__(self) -> Tuple[type, Tuple[None]]:
        """Deep-copied (an EMA of ``model.model``) or pickled (``torch.save(model.model, path)``),
        it is a hook that calls nothing."""
        return (WeightsLoadedHook, (None,))
