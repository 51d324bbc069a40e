"""The loss scaler shared by all losses, and apex's ``amp.state_dict`` format.

Module state: :data:`_shared`, the scaler of the latest ``initialize`` call and its
``num_losses`` (None before the first call). apex keeps the same global state
(``_amp_state.loss_scalers``), and like apex every ``initialize`` replaces it.

apex gives each of ``num_losses`` losses its own LossScaler; here every ``loss_id`` gets
the *same* :class:`roundpipe.GradScaler` (one scale, one skip decision per step), and
``state_dict()`` writes that scaler's state once per loss.

Scaler configuration (:func:`build_scaler`):

* ``"dynamic"``: ``GradScaler(init_scale=min(max_loss_scale, 2**16), growth_factor=2,
  backoff_factor=0.5, growth_interval=2000, min_scale=min_loss_scale or None,
  max_scale=max_loss_scale)``: with one backward per step this is apex's sequence
  (apex's window of 2000 is not reachable through ``initialize`` either; change it with
  ``set_growth_interval``). A falsy or non-positive ``min_loss_scale`` means no floor.
  One difference: apex floors only when it halves, GradScaler clamps at every update, so
  an initial scale below ``min_loss_scale`` is raised to it at the first ``update()``.
* a static number ``s``: a fixed scale (``min_scale == max_scale == s``). Unlike apex, which
  never checks gradients with a static scale, steps with inf/NaN gradients are skipped.
  apex's unskipped counter of a static scaler grows without bound; GradScaler's growth
  tracker restarts every 2000 steps, so a saved ``"unskipped"`` differs after 2000 steps.
* static ``1.0`` (O0's and O3's default): a *disabled* scaler, so nothing is scaled,
  unscaled or checked, as apex's short-circuit does (and GradScaler, which refuses to
  unscale float16 gradients, never sees O3's float16 ones).
"""

from __future__ import annotations

import operator
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, Mapping, MutableMapping, Optional, Union

from ..grad_scaler import GradScaler

__all__ = ["build_scaler", "install", "load_state_dict", "loss_scaler", "state_dict"]

_DYNAMIC_INIT_SCALE = 2.0**16
_DYNAMIC_WINDOW = 2000


@dataclass
class _Shared:
    scaler: GradScaler
    num_losses: int


_shared: Optional[_Shared] = None


def build_scaler(
    loss_scale: Union[str, float], min_loss_scale: Optional[float], max_loss_scale: float
) -> GradScaler:
    """The GradScaler for apex's ``loss_scale`` (``"dynamic"`` or a float), as described in
    the module docstring. ``ValueError`` for bounds GradScaler rejects."""
    if loss_scale == "dynamic":
        floor = min_loss_scale if min_loss_scale and min_loss_scale > 0 else None
        return GradScaler(
            init_scale=min(max_loss_scale, _DYNAMIC_INIT_SCALE),
            growth_factor=2.0,
            backoff_factor=0.5,
            growth_interval=_DYNAMIC_WINDOW,
            min_scale=floor,
            max_scale=max_loss_scale,
        )
    if loss_scale == 1.0:
        return GradScaler(enabled=False)
    return GradScaler(init_scale=loss_scale, min_scale=loss_scale, max_scale=loss_scale)


def install(scaler: GradScaler, num_losses: int) -> None:
    """Make ``scaler`` the shared scaler for ``num_losses`` losses (``initialize`` calls it)."""
    global _shared
    _shared = _Shared(scaler, num_losses)


def _require(what: str) -> _Shared:
    if _shared is None:
        raise RuntimeError(
            f"roundpipe.compat.{what}: there is no amp state yet; call "
            "roundpipe.compat.initialize first."
        )
    return _shared


def loss_scaler(loss_id: int = 0) -> GradScaler:
    """The shared :class:`roundpipe.GradScaler` (the same object for every ``loss_id``).

    ``loss_id`` indexes the ``num_losses`` losses like apex's list of scalers (negative ids
    count from the end): ``IndexError`` when out of range, ``TypeError`` when not an int.
    ``RuntimeError`` before ``initialize``.
    """
    shared = _require("loss_scaler")
    index = operator.index(loss_id)
    if not -shared.num_losses <= index < shared.num_losses:
        raise IndexError(
            f"loss_id {index} is out of range: initialize had num_losses={shared.num_losses}"
        )
    return shared.scaler


def state_dict(destination: Optional[MutableMapping[str, Any]] = None) -> MutableMapping[str, Any]:
    """apex's format: ``{"loss_scaler<i>": {"loss_scale": float, "unskipped": int}}`` for
    each of the ``num_losses`` losses, in order, all from the shared scaler (its current
    scale and growth tracker; 1.0 and 0 when disabled). Filled into ``destination`` when
    given, else a new ``OrderedDict``.

    Main thread; waits for queued optimizer work (``GradScaler.state_dict``). In the
    lagged mode of asynchronous steps, a result ``update()`` has not applied yet cannot be
    written in this format and is lost: save ``loss_scaler().state_dict()`` to keep it
    (:func:`load_state_dict` takes both). ``RuntimeError`` before ``initialize``.
    """
    shared = _require("state_dict")
    scaler_state = shared.scaler.state_dict()
    entry = {
        "loss_scale": float(scaler_state.get("scale", 1.0)),
        "unskipped": int(scaler_state.get("_growth_tracker", 0)),
    }
    result = OrderedDict() if destination is None else destination
    for index in range(shared.num_losses):
        result[f"loss_scaler{index}"] = dict(entry)
    return result


def load_state_dict(state_dict: Mapping[str, Any]) -> None:
    """Load apex's format or a GradScaler state dict (one with a ``"scale"`` key) into the
    shared scaler.

    apex's format is read as apex reads it: in key order, the n-th key containing
    ``"loss_scaler"`` belongs to loss n whatever its suffix; a count that differs from
    ``num_losses`` warns; entries beyond ``num_losses`` are skipped with a warning (and end
    the reading); keys without ``"loss_scaler"`` raise ``RuntimeError`` after the valid
    entries were applied. Every loss shares one scaler, so loss 0's entry is the one
    applied (its ``loss_scale`` and ``unskipped`` become the scale and growth tracker).

    A disabled scaler (static 1.0, ``enabled=False``) ignores what is loaded. A static
    scaler takes the loaded scale, but its fixed bound restores the configured value at
    the next ``update()``. ``RuntimeError`` before ``initialize``.
    """
    shared = _require("load_state_dict")
    if "scale" in state_dict:
        shared.scaler.load_state_dict(dict(state_dict))
        return
    if len(state_dict) != shared.num_losses:
        warnings.warn(
            f"the amp state dict has {len(state_dict)} entries, while {shared.num_losses} "
            "loss scalers are used"
        )
    unexpected = []
    index = 0
    for key, entry in state_dict.items():
        if "loss_scaler" not in key:
            unexpected.append(key)
            continue
        if index >= shared.num_losses:
            warnings.warn(f"skipping loss_scaler[{index}], since num_losses is {shared.num_losses}")
            break
        if index == 0:
            _load_entry(shared.scaler, entry)
        index += 1
    if unexpected:
        names = ", ".join(f'"{key}"' for key in unexpected)
        raise RuntimeError(f"Error(s) in loading the amp state dict. Unexpected key(s): {names}.")


def _load_entry(scaler: GradScaler, entry: Mapping[str, Any]) -> None:
    """Set the scale and growth tracker from one apex entry (a disabled scaler keeps none)."""
    loaded: Dict[str, Any] = {
        "scale": float(entry["loss_scale"]),
        "_growth_tracker": int(entry["unskipped"]),
        "_pending_found_inf": [],
    }
    if scaler.is_enabled():
        scaler.load_state_dict({**scaler.state_dict(), **loaded})
