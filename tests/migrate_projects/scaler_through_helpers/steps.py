"""Backward and optimizer step as separate helpers (called from the loop in main.py)."""

import torch


def backward_step(loss, grad_scaler):
    grad_scaler.scale(loss).backward()


def optimizer_step(optimizer, grad_scaler, model, max_norm=None):
    if max_norm is not None:
        grad_scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grad_scaler.step(optimizer)
    grad_scaler.update()
    optimizer.zero_grad(set_to_none=True)
