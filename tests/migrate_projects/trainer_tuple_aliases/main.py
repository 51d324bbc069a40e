"""Shape: a trainer whose scaler is chosen inline and whose step reads its objects into locals.

``self.scaler = GradScaler("cuda", ...) if use_cuda else GradScaler("cpu", ...)`` picks the
scaler's device and settings in one conditional expression, and ``train_step`` starts with
``model, optimizer, scaler = self.model, self.optimizer, self.scaler`` before writing the
step on the locals. Hard: the scaler is built in two branches of one expression and reached
through a tuple unpacking; the plain path (``--no-amp``) must keep working.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, use_cuda, amp):
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.scaler = (
            torch.amp.GradScaler("cuda", init_scale=2.0**16)
            if use_cuda
            else torch.amp.GradScaler("cpu", enabled=amp, init_scale=512.0, growth_interval=2)
        )

    def train_step(self, x, y):
        model, optimizer, scaler = self.model, self.optimizer, self.scaler
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(x)
        loss = F.mse_loss(pred.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    trainer = Trainer(model, False, args.amp)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        x = torch.randn(20, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True) * 0.3
        loss = trainer.train_step(x, y)
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
