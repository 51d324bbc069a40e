"""Shape: MAE's three-file layout, the wrapper's module imported under an alias.

``util/misc.py`` defines ``NativeScalerWithGradNormCount`` (a loss-scaler wrapper class,
issue 10 shape 2); ``main.py`` imports the module (``import util.misc as misc``) and builds
``misc.NativeScalerWithGradNormCount()`` beside the model; ``engine.py`` calls the instance
with an ``update_grad`` accumulation flag and a clipping norm. Hard: the construction names
the class through the module alias, and the class, its construction and its call site are
in three files that must be migrated together.
"""

import argparse

import torch
import torch.nn as nn

import util.misc as misc
from engine import train_one_epoch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--min_lr", type=float, default=1e-4)
    parser.add_argument("--warmup_epochs", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accum_iter", type=int, default=2)
    parser.add_argument("--clip_grad", type=float, default=0.5)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = misc.NativeScalerWithGradNormCount()
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(5)
    ]
    for epoch in range(args.epochs):
        train_one_epoch(model, batches, optimizer, epoch, loss_scaler, args)
    print("weight sum", repr(sum(p.sum().item() for p in model.parameters())))
    print("final scale", loss_scaler.state_dict()["scale"])


if __name__ == "__main__":
    main()
