"""The trainer of the two-path project: state on ``self``, the plain path written first."""

import math

import torch
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, amp, accum):
        self.model = model
        self.amp = amp
        self.accum = accum
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1, enabled=amp)

    def train_step(self, i, x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
            out = self.model(x)
        loss = F.l1_loss(out.float(), y)
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"loss is {loss.item()} at step {i}")
        logged = loss.item()
        loss = loss / self.accum
        if not self.amp:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
        if (i + 1) % self.accum == 0:
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.optimizer.zero_grad()
        return logged
