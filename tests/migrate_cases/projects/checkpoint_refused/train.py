"""Project rule: consistency. This file alone would migrate, but the checkpoint helper it
imports (checkpoint.py) holds a scaler use that is refused; the two take part in one
program, so this file is left unchanged too (RPM110 naming checkpoint.py)."""

import torch

from checkpoint import save_optimizer


def main(loader, path):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    save_optimizer(optimizer, path)
