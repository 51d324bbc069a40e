"""Step helpers that name the scaler they are handed each in their own way."""

import torch


def backward_step(loss, amp_scaler):
    amp_scaler.scale(loss).backward()


def optimizer_step(optimizer, grad_scaler, model, max_norm=1.0):
    grad_scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    grad_scaler.step(optimizer)
    grad_scaler.update()
    optimizer.zero_grad()
