"""Diagnostic RPM114: `model_without_ddp = model` is bound before the RoundPipe wrap (as
torchvision's reference trainers do) and used after it; it would still name the unwrapped
module, so the checkpoint would miss the newest weights. Left unchanged."""

import torch


def main(loader, path):
    model = torch.nn.Linear(8, 2)
    model_without_ddp = model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    torch.save(model_without_ddp.state_dict(), path)
