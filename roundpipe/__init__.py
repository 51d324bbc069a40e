"""roundpipe: a one-device implementation of RoundPipe's training API with a thread-aware
GradScaler (see docs/). Importing it starts no thread; the optimizer thread starts on first use.
"""

from . import optim_stream
from .grad_scaler import GradScaler, OptState

__all__ = ["GradScaler", "OptState", "optim_stream"]

