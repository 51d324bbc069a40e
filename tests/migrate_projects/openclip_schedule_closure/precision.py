"""Autocast chosen from the precision string, as OpenCLIP's ``precision.py`` does."""

from contextlib import suppress
from functools import partial

import torch


def get_autocast(precision, device_type="cpu"):
    """A callable returning the context the forward runs in."""
    if precision == "amp":
        return partial(torch.amp.autocast, device_type=device_type, dtype=torch.bfloat16)
    return suppress
