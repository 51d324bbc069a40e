"""What the trainer does to gradients before a step (DINO keeps these in utils.py)."""

import torch


def clip_gradients(model, clip):
    norms = []
    for p in model.parameters():
        if p.grad is not None:
            param_norm = p.grad.data.norm(2)
            norms.append(param_norm.item())
            clip_coef = clip / (param_norm + 1e-6)
            if clip_coef < 1:
                p.grad.data.mul_(clip_coef)
    return norms


def cancel_gradients_last_layer(epoch, model, freeze_last_layer):
    if epoch >= freeze_last_layer:
        return
    for name, p in model.named_parameters():
        if "last_layer" in name:
            p.grad = None


def clip_total_norm(parameters, max_norm):
    """Clip the total norm of the gradients of ``parameters``; the norm before clipping."""
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm).item()
