"""No-op twin of model_alias_checkpoint: the alias and the checkpoint without a training
step (the GradScaler is only restored), nothing to rewrite."""

import torch


def restore(model, scaler: "torch.amp.GradScaler", path):
    raw_model = model
    state = torch.load(path)
    raw_model.load_state_dict(state["model"])
    scaler.load_state_dict(state["scaler"])
