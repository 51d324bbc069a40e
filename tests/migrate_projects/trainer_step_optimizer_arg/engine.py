"""A trainer whose step method is handed the optimizer by its callers."""

import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, amp=True):
        self.model = model
        self.scaler = torch.amp.GradScaler("cpu", init_scale=512.0, growth_interval=2, enabled=amp)
        self.amp = amp

    def train_step(self, batch, optimizer, max_norm=None):
        x, y = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
            loss = nn.functional.mse_loss(self.model(x).float(), y)
        optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        if max_norm is not None:
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.scaler.step(optimizer)
        self.scaler.update()
        return loss.item()

    def fit(self, batches, optimizer):
        for step, batch in enumerate(batches):
            loss = self.train_step(batch, optimizer, max_norm=1.0)
            print(f"step {step} loss {loss!r}")
