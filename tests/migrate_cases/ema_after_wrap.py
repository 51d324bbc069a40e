"""An EMA copy built from the model after the optimizer (timm's ModelEmaV2) and updated every
step: it is built from and updated with the wrapped module (model.model), one step stale in
the default form (rule model_averages)."""

import torch
from timm.utils import ModelEmaV2


def main(loader):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model_ema = ModelEmaV2(model, decay=0.999)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        model_ema.update(model)
