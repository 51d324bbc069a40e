"""The text of a small trainer class (model, optimizer and scaler on ``self``, the AMP step
in ``train_step``) that test programs extend with their own ``fit`` or subclass; not a test
module."""

TRAINER_CLASS = """
import torch
import torch.nn as nn


class Trainer:
    def __init__(self):
        self.model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)
        self.scaler = torch.amp.GradScaler("cpu")

    def train_step(self, x, y):
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        return loss

"""
