"""Shape: timm/DeiT-style ``train_one_epoch`` with gradient accumulation and a leftover batch.

``optimizer.zero_grad()`` runs once before the epoch's loop and again after each step; the
loop skips the step with ``continue`` until ``accum`` batches are accumulated. An epoch of
10 batches with ``accum=3`` leaves batch 9's gradient pending when it ends; the next epoch's
pre-loop ``zero_grad()`` drops it. Hard: that ``zero_grad()`` stays on the main thread,
outside the step function, and must clear the model's pending gradient as well as the
optimizer's (in RoundPipe form they are different tensors).
"""

import torch
from torch import nn

torch.manual_seed(0)


def train_one_epoch(model, optimizer, scaler, data, accum, epoch):
    model.train()
    running = 0.0
    optimizer.zero_grad()
    for i, (x, y) in enumerate(data):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.float(), y, label_smoothing=0.1)
        running += loss.item()
        scaler.scale(loss / accum).backward()
        if (i + 1) % accum != 0:
            continue
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {epoch * len(data) + i} loss {running / (i + 1)!r}")
    return running / len(data)


def main():
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 4))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, alpha=0.9)
    scaler = torch.amp.GradScaler("cpu")
    data = [(torch.randn(3, 10), torch.randint(0, 4, (3,))) for _ in range(10)]
    for epoch in range(3):
        avg = train_one_epoch(model, optimizer, scaler, data, 3, epoch)
        print("epoch", epoch, repr(avg))
    print("final scale", scaler.get_scale(), repr(sum(p.double().sum().item() for p in model.parameters())))


if __name__ == "__main__":
    main()
