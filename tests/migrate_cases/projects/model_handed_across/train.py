"""Project rule: the model this file would wrap is handed to evaluate() of evaluation.py,
which the migration does not follow across files (it could save or compare raw
state_dict keys); this file is left unchanged (RPM110)."""

import torch

from evaluation import evaluate


def main(loader, val_loader):
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
    print(evaluate(model, val_loader))
