"""No-op twin of next_batch_fetch: the fetch-after-forward loop with a GradScaler that is
only constructed and checkpointed (no training step here), so nothing is rewritten."""

import torch


def save(path, scaler: "torch.amp.GradScaler"):
    torch.save({"scaler": scaler.state_dict()}, path)
