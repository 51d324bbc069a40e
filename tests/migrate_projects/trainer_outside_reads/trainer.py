"""The trainer class of the ``trainer_outside_reads`` project: model, optimizer, scheduler
and scaler on ``self``, one AMP step per ``train_step`` call."""

import torch
from torch import nn


class Trainer:
    def __init__(self, width, lr):
        self.model = nn.Sequential(nn.Linear(6, width), nn.Tanh(), nn.Linear(width, 2))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=1, gamma=0.7)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2)
        self.steps = 0

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(self.model(x).float(), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.steps += 1
        return loss.detach()
