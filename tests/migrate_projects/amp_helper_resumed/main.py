"""Shape: an AMP helper class (issue 10, shape 2) built in the function that builds the model
and runs the loop; the loop keeps the norm of a clipping between the helper's ``unscale`` and
``optimizer_step``, and a second helper is built after the loop to resume from the checkpoint.
Hard: the second helper also needs the RoundPipe model, and the last ``model.parameters()``
assignment before it is the clipping's norm, not the optimizer; the model must be wrapped once,
where the optimizer is built, and the clipping must clip the optimizer copies.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from amp_utils import AMPScaler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-3)
    amp = AMPScaler()
    gen = torch.Generator().manual_seed(1)
    batches = [(torch.randn(16, 8, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(10)]
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y) / args.accum
        amp.scale_loss(loss).backward()
        if (i + 1) % args.accum == 0:
            amp.unscale(optimizer)
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.3)
            amp.optimizer_step(optimizer)
            optimizer.zero_grad()
            print(f"step {i // args.accum} loss {loss.item()!r} norm {norm.item()!r} scale {amp.get_scale()!r}")
    checkpoint = {"model": model.state_dict(), "amp": amp.state_dict()}
    resumed = AMPScaler()
    resumed.load_state_dict(checkpoint["amp"])
    print(f"weights {sorted(checkpoint['model'])!r}")
    print(f"final scale {resumed.get_scale()!r}")


if __name__ == "__main__":
    main()
