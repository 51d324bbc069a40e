"""Shape: two explicit training paths, AMP and plain (issue 10, shape 4).

``if args.precision == "bf16":`` holds autocast, ``scaler.scale(loss).backward()``, unscale,
clip, step and update; the ``else`` branch does ``loss.backward()``, the same clip and
``optimizer.step()``. The scaler exists on both paths (``enabled=`` the flag), as many
scripts build it unconditionally. Hard: two steps in one loop, the plain one must keep
working (the harness runs ``--precision fp32`` too).
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--clip", type=float, default=0.5)
    return parser.parse_args()


def main():
    args = parse_args()
    use_amp = args.precision == "bf16"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 8), nn.Flatten(), nn.Linear(24, 20))
    optimizer = torch.optim.NAdam(model.parameters(), lr=5e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, enabled=use_amp)
    gen = torch.Generator().manual_seed(13)
    for step in range(8):
        tokens = torch.randint(0, 20, (16, 3), generator=gen)
        target = tokens.sum(dim=1) % 20
        optimizer.zero_grad()
        if args.precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(tokens), target)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss = F.cross_entropy(model(tokens), target)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            optimizer.step()
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
