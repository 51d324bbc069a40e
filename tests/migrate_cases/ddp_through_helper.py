"""Diagnostic RPM101: the model is wrapped in DistributedDataParallel by a helper function
of the module (`model = setup_distributed(model)`), detected like a direct wrap."""

import torch
from torch.nn.parallel import DistributedDataParallel


def setup_distributed(module):
    return DistributedDataParallel(module.cuda(), device_ids=[0])


def main(loader):
    model = torch.nn.Linear(8, 2)
    model = setup_distributed(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
