"""Optimizers for RoundPipe's optimizer copies."""

from .adam import Adam

__all__ = ["Adam"]
