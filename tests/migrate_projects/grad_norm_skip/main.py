"""Shape: a grad norm that decides, on the main thread, whether to step (issue 10, shapes 7
and 9).

Speech-trainer style (ESPnet-like): after ``unscale_`` the norm from ``clip_grad_norm_`` is
checked with ``torch.isfinite``; a non-finite norm logs a warning and still calls
``scaler.step`` (which skips) and ``scaler.update``, a finite one steps normally; a batch
with an ``inf`` feature makes one iteration overflow. Hard: a value computed from the
unscaled gradients chooses a branch of the loop.
"""

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 12))
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**13, growth_interval=2)
    gen = torch.Generator().manual_seed(28)
    grad_clip = 5.0
    skipped = 0
    for iiter in range(8):
        speech = torch.randn(10, 12, generator=gen)
        if iiter == 3:
            speech[0, 0] = float("inf")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(speech).float(), speech.tanh())
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=grad_clip)
        if not torch.isfinite(grad_norm):
            logging.warning(f"The grad norm is {grad_norm}. Skipping updating the model.")
            skipped += 1
            scaler.step(optimizer)
            scaler.update()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
        print(f"step {iiter} loss {loss.item()!r} grad_norm {grad_norm.item()!r}")
    print(f"final scale {scaler.get_scale()!r} skipped {skipped}")


if __name__ == "__main__":
    main()
