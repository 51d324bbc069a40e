"""Shape: checkpoint helpers that only save or load a scaler's state (issue 10, shape 13).

``checkpointing.py`` never trains: it saves and restores model, optimizer and (when given)
scaler state, with ``if scaler is not None`` guards. ``main.py`` is a textbook loop that
trains one epoch, saves, rebuilds everything and resumes. Hard: the helpers must migrate
with the loop (keys kept) or get an informational note, never a refusal.
"""

import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

from checkpointing import resume_checkpoint, save_checkpoint


def build():
    model = nn.Sequential(nn.Linear(5, 10), nn.Softplus(), nn.Linear(10, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**7, growth_interval=2)
    return model, optimizer, scaler


def train_epoch(model, optimizer, scaler, batches, epoch):
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            output = model(x)
            loss = F.cross_entropy(output, y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {epoch * len(batches) + i} loss {loss.item()!r}")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(23)
    batches = [(torch.randn(10, 5, generator=gen), torch.randint(0, 2, (10,), generator=gen)) for _ in range(4)]
    model, optimizer, scaler = build()
    train_epoch(model, optimizer, scaler, batches, epoch=0)
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "last.pth.tar")
        save_checkpoint(path, model, optimizer, scaler, epoch=0)
        model, optimizer, scaler = build()
        start_epoch = resume_checkpoint(path, model, optimizer, scaler)
    train_epoch(model, optimizer, scaler, batches, epoch=start_epoch)
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
