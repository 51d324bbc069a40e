"""roundpipe: upstream RoundPipe's training API for one device (CPU or one GPU), with a
thread-aware GradScaler. See docs/. Importing it starts no thread; the optimizer thread
starts on first use.
"""

# Public beyond __all__ (which lists upstream RoundPipe's names): compat, the apex layer migrated
# scripts call; optim_stream, the optimizer thread; OptState, the scaler's per-optimizer state.
# `name as name` marks each as a deliberate re-export.
from . import compat as compat
from . import optim
from . import optim_stream as optim_stream
from .grad_scaler import GradScaler
from .grad_scaler import OptState as OptState
from .optimizer_ctx import OptimizerCtx
from .plan import ModelExecutePlan
from .recompute import doing_recompute, get_recompute_data, save_for_recompute
from .run_config import RoundPipeRunConfig
from .runtime import RoundPipe, wrap_model_to_roundpipe

__all__ = [
    "doing_recompute",
    "OptimizerCtx",
    "get_recompute_data",
    "save_for_recompute",
    "GradScaler",
    "optim",
    "RoundPipe",
    "RoundPipeRunConfig",
    "ModelExecutePlan",
    "wrap_model_to_roundpipe",
]
