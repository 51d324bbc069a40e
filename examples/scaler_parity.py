"""Train one small model three ways and print the scale sequences side by side.

    python examples/scaler_parity.py [--steps 12]

1. torch.amp.GradScaler in a plain loop (the reference);
2. roundpipe.GradScaler in the same plain loop (drop-in: identical bits);
3. roundpipe.GradScaler with the step queued on the optimizer thread and not waited for
   before update() (RoundPipe's asynchronous mode: the one-iteration lag).

Overflow is forced on chosen steps so that backoff and growth both show. Exit status 1 if the
drop-in run differs from torch's in any scale or parameter bit.
"""

from __future__ import annotations

import argparse
import sys

import torch

import roundpipe
from roundpipe import optim_stream


def train(make_scaler, steps: int, queued: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = make_scaler()
    data = torch.Generator().manual_seed(1)
    used = []
    for step in range(steps):
        x = torch.randn(32, 16, generator=data)
        y = x.sum(dim=1, keepdim=True)
        used.append(scaler.get_scale())
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        if step % 5 == 2:  # force an overflow
            with torch.no_grad():
                model[0].weight.grad[0, 0] = float("inf")

        def step_fn():
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            optimizer.zero_grad()

        job = optim_stream.launch(step_fn) if queued else step_fn()
        scaler.update()
        if queued:
            job.wait()  # before the next backward touches the grads
        print(f"step {step} loss {loss.item():.6f} scale {used[-1]:g}")
    return used, [p.detach().clone() for p in model.parameters()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    args = parser.parse_args()
    make = dict(init_scale=2.0**10, growth_interval=2)
    print("== torch.amp.GradScaler, plain loop")
    ref = train(lambda: torch.amp.GradScaler("cpu", **make), args.steps, queued=False)
    print("== roundpipe.GradScaler, plain loop")
    ours = train(lambda: roundpipe.GradScaler(**make), args.steps, queued=False)
    print("== roundpipe.GradScaler, step queued on the optimizer thread (async)")
    lagged = train(lambda: roundpipe.GradScaler(**make), args.steps, queued=True)
    print()
    print(f"{'step':>4} {'torch':>8} {'drop-in':>8} {'async':>8}")
    for k, (a, b, c) in enumerate(zip(ref[0], ours[0], lagged[0])):
        print(f"{k:>4} {a:>8g} {b:>8g} {c:>8g}")
    same = ref[0] == ours[0] and all(torch.equal(a, b) for a, b in zip(ref[1], ours[1]))
    print(f"drop-in vs torch: {'bitwise identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
