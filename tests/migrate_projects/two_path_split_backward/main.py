"""Shape: the two-path backward split, the optimizer work after it (issue 10, shape 4).

The flag picks only the backward (``if use_amp: scaler.scale(loss).backward() else:
loss.backward()``); what follows is picked again: an optional clip whose unscale runs on the
AMP path only, then ``if use_amp: scaler.step(...); scaler.update() else: optimizer.step()``,
and one ``zero_grad``. Hard: two backwards for one step, and the plain path must keep working
(the harness runs ``--no-amp`` too). The forward can move into a loss function (the fused
form), the flag's test going with it.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    parser.add_argument("--clip", type=float, default=0.8)
    parser.add_argument("--steps", type=int, default=6)
    return parser.parse_args()


def train_epoch(model, criterion, optimizer, scaler, batches, use_amp, clip):
    for step, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = criterion(model(x).float(), y)
        # one backward per path
        if use_amp:
            scaler.scale(loss).backward()
        else:
            loss.backward()
        if clip:
            if use_amp:
                scaler.unscale_(optimizer)  # clip what the optimizer will see
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        if use_amp:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")


def main():
    args = parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2, enabled=args.amp)
    gen = torch.Generator().manual_seed(5)
    batches = []
    for _ in range(args.steps):
        x = torch.randn(12, 6, generator=gen)
        batches.append((x, x[:, :2].sum(dim=1, keepdim=True) - 0.4 * x[:, 3:4]))
    train_epoch(model, F.mse_loss, optimizer, scaler, batches, args.amp, args.clip)
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
