"""Rule: forward + loss -> model.forward_backward(loss_fn=...), only what the loss needs.

Between the loss and the backward this loop counts samples and fetches the next batch (the
prefetching shape of many trainers). Only the forward and the loss move into the loss
function; the bookkeeping and the fetch stay on the main thread, after the forward, in the
same order. The huge initial scale makes loss * scale overflow float32 for the first steps:
the logged loss must stay the real loss.
"""

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
    data = iter([(torch.randn(16, 8), 10 * torch.randn(16, 1)) for _ in range(13)])
    seen = 0
    x, y = next(data)
    for step in range(12):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(x)
            loss = nn.functional.mse_loss(out.float(), y)
        seen += x.shape[0]  # bookkeeping: stays where it runs
        x, y = next(data)  # the next batch: fetched after this loss, as before
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f} seen {seen} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
