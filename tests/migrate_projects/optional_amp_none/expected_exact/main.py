"""Shape: optional AMP with a scaler that may be None (issue 10, shape 4), migrated by
hand: the --exact target.

Autograd form on both paths: ``pred = model(x)`` and the loss stay as written, each branch
keeps its own backward, and only the optimizer work (with the ``zero_grad`` that preceded
the next backward) moves into a step function; the scaler, when there is one, is
RoundPipe's, and ``None`` stays ``None``.

Original docstring:

``scaler = GradScaler() if args.amp else None``; the step is guarded by ``if scaler is not
None`` with a plain ``loss.backward(); optimizer.step()`` branch, and autocast is switched
by the same flag. Hard: both paths must keep working after migration (the harness runs the
program with and without ``--no-amp``), and the scaler's uses sit under guards.
"""

import argparse

import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=0.05)
    return parser.parse_args()


def main():
    args = get_args()
    torch.manual_seed(0)
    model = roundpipe.RoundPipe(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=args.lr, momentum=0.9, nesterov=True)
    scaler = roundpipe.GradScaler(init_scale=512.0, growth_interval=2) if args.amp else None
    gen = torch.Generator().manual_seed(3)
    for step in range(args.steps):
        x = torch.randn(20, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True) * 0.3 + 0.1 * torch.randn(20, 1, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
            pred = model(x)
        loss = F.smooth_l1_loss(pred.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()

            def step_fn():
                scaler.step(optimizer)
                optimizer.zero_grad(set_to_none=True)

            model.step(step_fn, is_async=False)
            scaler.update()
        else:
            loss.backward()

            def step_fn():
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            model.step(step_fn, is_async=False)
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale() if scaler is not None else None!r}")


if __name__ == "__main__":
    main()
