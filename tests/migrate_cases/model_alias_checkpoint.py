"""Rule: checkpoints keep their keys through an alias of the wrapped model.

`raw_model = model` after the model is built (the shape of GPT trainers) is the same object
as the wrapped model, so its `state_dict()` goes through the wrapped module too, after a
synchronize."""

import torch


def main(loader, path):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    raw_model = model
    scaler = torch.amp.GradScaler("cuda")
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    torch.save({"model": raw_model.state_dict(), "scaler": scaler.state_dict()}, path)
