"""Precision helpers: an autocast context chosen from the config."""

import contextlib

import torch


def get_autocast(precision):
    """A context manager for the forward pass under ``precision`` ("bf16" or "32")."""
    if precision == "bf16":
        return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@contextlib.contextmanager
def maybe_autocast(enabled):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled):
        yield
