"""The training loop of the AMP helper project: it only receives the helper (built in main.py)."""

import torch
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer, amp, clip_grad):
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        if step % 2 == 0:
            amp.scale_loss(loss).backward()
        else:
            amp.backward(loss)
        amp.unscale(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        amp.optimizer_step(optimizer)
        print(f"step {step} loss {loss.item()!r} norm {norm.item()!r}")
