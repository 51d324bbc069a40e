"""The loss scalers of the latest ``initialize`` call, and apex's ``amp.state_dict`` format.

Module state: :data:`_shared`, the :class:`~roundpipe.compat.loss_scaler.AmpLossScaler` of
each of the ``num_losses`` losses (None before the first call). apex keeps the same global
state (``_amp_state.loss_scalers``), and like apex every ``initialize`` replaces it. Each
loss has its own scale and counter, as apex's one LossScaler per loss; they share the
optimizers' skip flags, so a step is skipped when any loss of the iteration overflowed.

:func:`build_scalers` maps apex's ``loss_scale``, ``min_loss_scale`` and
``max_loss_scale`` onto them (the rule is in :mod:`roundpipe.compat.loss_scaler`).
"""

from __future__ import annotations

import operator
import warnings
from collections import OrderedDict
from typing import Any, List, Mapping, MutableMapping, Optional, Union

from .loss_scaler import AmpLossScaler, Number
from .steps import OptimizerSteps

__all__ = ["apex_entries", "build_scalers", "install", "load_state_dict", "loss_scaler", "state_dict"]

_shared: Optional[List[AmpLossScaler]] = None


def build_scalers(
    num_losses: int,
    loss_scale: Union[str, Number],
    min_loss_scale: Optional[Number],
    max_loss_scale: Number,
    steps: OptimizerSteps,
    master_weights: bool,
    enabled: bool = True,
) -> List[AmpLossScaler]:
    """``num_losses`` loss scalers sharing ``steps`` (``update()`` of one ends the iteration
    of all). ``ValueError`` for the bounds :class:`AmpLossScaler` rejects."""
    scalers = [
        AmpLossScaler(loss_scale, min_loss_scale, max_loss_scale, steps, master_weights, enabled)
        for _ in range(num_losses)
    ]
    for scaler in scalers:
        scaler.link(scalers)
    return scalers


def install(scalers: List[AmpLossScaler]) -> None:
    """Make ``scalers`` the loss scalers of the amp state (``initialize`` calls it)."""
    global _shared
    _shared = list(scalers)


def _require(what: str) -> List[AmpLossScaler]:
    if _shared is None:
        raise RuntimeError(
            f"roundpipe.compat.{what}: there is no amp state yet; call roundpipe.compat.initialize first."
        )
    return _shared


def loss_scaler(loss_id: int = 0) -> AmpLossScaler:
    """The scaler of loss ``loss_id`` (apex's ``scale_loss(..., loss_id=k)`` uses scale k).

    ``loss_id`` indexes the ``num_losses`` losses like apex's list of scalers (negative ids
    count from the end): ``IndexError`` when out of range, ``TypeError`` when not an int.
    ``RuntimeError`` before ``initialize``.
    """
    scalers = _require("loss_scaler")
    index = operator.index(loss_id)
    if not -len(scalers) <= index < len(scalers):
        raise IndexError(f"loss_id {index} is out of range: initialize had num_losses={len(scalers)}")
    return scalers[index]


def state_dict(destination: Optional[MutableMapping[str, Any]] = None) -> MutableMapping[str, Any]:
    """apex's format: ``{"loss_scaler<i>": {"loss_scale": S, "unskipped": n}}`` for each
    loss, in order, with the values as they are held (a static int scale stays an int; 1.0
    and 0 when disabled). Filled into ``destination`` when given, else a new
    ``OrderedDict``. Main thread. ``RuntimeError`` before ``initialize``.
    """
    scalers = _require("state_dict")
    result = OrderedDict() if destination is None else destination
    for index, scaler in enumerate(scalers):
        result[f"loss_scaler{index}"] = scaler.state_dict()
    return result


def load_state_dict(state_dict: Mapping[str, Any]) -> None:
    """Load apex's format (or a GradScaler state dict, which has a ``"scale"`` key, into
    loss 0) into the loss scalers, read by :func:`apex_entries`. Every configuration takes
    the loaded scale and counter (static, O0 and O3 included), as apex does; the entries
    before an unexpected key are applied before its ``RuntimeError``. ``RuntimeError``
    before ``initialize``.
    """
    scalers = _require("load_state_dict")
    if "scale" in state_dict:
        scalers[0].load_state_dict(dict(state_dict))
        return
    failure: Optional[_UnexpectedKeys] = None
    try:
        entries = apex_entries(state_dict, len(scalers))
    except _UnexpectedKeys as error:
        entries, failure = error.entries, error
    for scaler, entry in zip(scalers, entries):
        scaler.load_state_dict(entry)
    if failure is not None:
        raise RuntimeError(str(failure))


class _UnexpectedKeys(RuntimeError):
    def __init__(self, message: str, entries: List[Mapping[str, Any]]) -> None:
        super().__init__(message)
        self.entries = entries


def apex_entries(state_dict: Mapping[str, Any], num_losses: int) -> List[Mapping[str, Any]]:
    """The entries of apex's ``amp.state_dict()`` format, read as apex reads them: in key
    order, the n-th key containing ``"loss_scaler"`` belongs to loss n whatever its suffix;
    a count that differs from ``num_losses`` warns; entries beyond ``num_losses`` are
    skipped with a warning (and end the reading); keys without ``"loss_scaler"`` raise a
    ``RuntimeError`` (its ``entries`` attribute holds the entries read)."""
    if len(state_dict) != num_losses:
        warnings.warn(f"the amp state dict has {len(state_dict)} entries, while {num_losses} loss scalers are used")
    unexpected = []
    entries: List[Mapping[str, Any]] = []
    for key, entry in state_dict.items():
        if "loss_scaler" not in key:
            unexpected.append(key)
            continue
        if len(entries) >= num_losses:
            warnings.warn(f"skipping loss_scaler[{len(entries)}], since num_losses is {num_losses}")
            break
        entries.append(entry)
    if unexpected:
        names = ", ".join(f'"{key}"' for key in unexpected)
        raise _UnexpectedKeys(f"Error(s) in loading the amp state dict. Unexpected key(s): {names}.", entries)
    return entries
