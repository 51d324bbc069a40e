"""Diagnostic RPM104: a trainer class holds the scaler it was given in `self.scaler` (the
scaler is built in another file) and scales the loss through the attribute. The
migration does not follow attributes; the file is named, never passed over."""

import torch


class Trainer:
    def __init__(self, model, optimizer, scaler):
        self.model, self.optimizer, self.scaler = model, optimizer, scaler

    def train_step(self, x, y):
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad()
        return loss
