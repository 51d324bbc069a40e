import torch
from torch import nn


def main(loader, accum_steps=4):
    model = nn.Linear(8, 2)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)

    for i, (x, y) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = criterion(out, y) / accum_steps  # average over the accumulation window
        scaler.scale(loss).backward()
        running = loss.item()
        if (i + 1) % accum_steps == 0:
            # clip on unscaled gradients
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            scheduler.step()
            print(f"step {i} loss {running:.4f} scale {scaler.get_scale()}")
