"""apex.amp's optimization levels O0-O3 and the validation of ``initialize``'s overrides.

:data:`OPT_LEVELS` is apex's property table. :func:`resolve_properties` starts from a level's
row and applies the caller's overrides (every keyword that is not None) in apex's fixed
order, with apex's checks:

* an unknown ``opt_level`` (also None, ``"o1"`` or ``"01"``) is a ``RuntimeError``;
* under O1, ``cast_model_type`` other than None/False/``torch.float32``, any
  ``keep_batchnorm_fp32`` and any ``master_weights`` (even False) are ``RuntimeError``;
* ``patch_torch_functions=True`` with a level other than O1 is a ``RuntimeError``;
* ``keep_batchnorm_fp32`` takes True, False, None or the strings ``"True"``/``"False"``
  (turned into bools); anything else is an ``AssertionError``;
* ``loss_scale`` is ``"dynamic"`` (exactly) or anything ``float()`` accepts (numbers,
  numeric strings); ``float()``'s ``ValueError``/``TypeError`` otherwise.

apex can turn the ``RuntimeError`` checks into printed warnings with its private
``_amp_state.hard_override``; there is no such switch here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Union

import torch

__all__ = ["OPT_LEVELS", "AmpProperties", "resolve_properties"]

OPT_LEVELS: Dict[str, Dict[str, Any]] = {
    "O0": {
        "enabled": True,
        "cast_model_type": torch.float32,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": None,
        "master_weights": False,
        "loss_scale": 1.0,
    },
    "O1": {
        "enabled": True,
        "cast_model_type": None,
        "patch_torch_functions": True,
        "keep_batchnorm_fp32": None,
        "master_weights": None,
        "loss_scale": "dynamic",
    },
    "O2": {
        "enabled": True,
        "cast_model_type": torch.float16,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": True,
        "master_weights": True,
        "loss_scale": "dynamic",
    },
    "O3": {
        "enabled": True,
        "cast_model_type": torch.float16,
        "patch_torch_functions": False,
        "keep_batchnorm_fp32": False,
        "master_weights": False,
        "loss_scale": 1.0,
    },
}
"""apex's property table: opt level -> the properties it selects (read-only by convention)."""


@dataclass
class AmpProperties:
    """The resolved properties of one ``initialize`` call (apex's ``Properties``)."""

    opt_level: str
    enabled: bool
    cast_model_type: Any  # a torch.dtype, or None/False for "do not cast the model"
    patch_torch_functions: bool
    keep_batchnorm_fp32: Optional[bool]
    master_weights: Optional[bool]
    loss_scale: Union[str, float]  # "dynamic" or a static scale


def resolve_properties(
    opt_level: Any,
    cast_model_type: Any = None,
    patch_torch_functions: Any = None,
    keep_batchnorm_fp32: Any = None,
    master_weights: Any = None,
    loss_scale: Any = None,
) -> AmpProperties:
    """The properties of ``opt_level`` after applying the overrides that are not None.

    The keywords are ``initialize``'s. Raises as listed in the module docstring.
    """
    if not isinstance(opt_level, str) or opt_level not in OPT_LEVELS:
        raise RuntimeError(
            f"Unexpected optimization level {opt_level!r}. Options are 'O0', 'O1', 'O2', "
            "'O3'. Note that in 'O0', 'O1', etc., the prefix O is the letter O, not the "
            "number zero."
        )
    # apex's order of application; each check sees the chosen level.
    overrides = {
        "cast_model_type": cast_model_type,
        "patch_torch_functions": patch_torch_functions,
        "keep_batchnorm_fp32": keep_batchnorm_fp32,
        "master_weights": master_weights,
        "loss_scale": loss_scale,
    }
    values = dict(OPT_LEVELS[opt_level])
    for name, value in overrides.items():
        if value is not None:
            values[name] = _checked(opt_level, name, value)
    return AmpProperties(opt_level=opt_level, **values)


def _checked(opt_level: str, name: str, value: Any) -> Any:
    """Validate one property value under ``opt_level``; return it normalized."""
    o1 = opt_level == "O1"
    if name == "cast_model_type":
        if o1 and value is not None and value is not False and value is not torch.float32:
            raise RuntimeError(
                "With opt_level O1 the model weights stay float32 (O1 casts around torch "
                "functions instead); to cast the model use opt_level 'O2' or 'O3'. "
                f"cast_model_type was {value}."
            )
        return value
    if name == "patch_torch_functions":
        if value and not o1:
            raise RuntimeError(f"patch_torch_functions=True is only valid with opt_level 'O1', not {opt_level!r}.")
        return bool(value)
    if name == "keep_batchnorm_fp32":
        if o1 and value is not None:
            raise RuntimeError(
                "With opt_level O1 batchnorm already runs in float32, so "
                f"keep_batchnorm_fp32 must be None; it was {value!r}."
            )
        if value == "True":
            return True
        if value == "False":
            return False
        assert value is True or value is False or value is None, (
            "keep_batchnorm_fp32 must be a bool, the string 'True' or 'False', or None; "
            f"got keep_batchnorm_fp32={value!r}"
        )
        return value
    if name == "master_weights":
        if o1 and value is not None:
            raise RuntimeError(
                "master_weights makes no sense with opt_level O1: the model weights are "
                f"already float32. master_weights was {value!r}."
            )
        return value
    # loss_scale
    return value if isinstance(value, str) and value == "dynamic" else float(value)
