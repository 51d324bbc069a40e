"""Shape: MAE's three-file layout, with the wrapper imported under another name.

``util/misc.py`` defines ``NativeScalerWithGradNormCount`` (a loss-scaler wrapper class,
issue 10 shape 2); ``main.py`` imports it ``as NativeScaler``, builds it beside the model,
keeps ``model_without_ddp = model`` for the checkpoint and evaluates through ``engine.py``;
``engine.py`` calls the instance with an ``update_grad`` accumulation flag. Hard: the class,
its construction and its call sites are in three files and the construction spells the class
by its alias, so all three must be migrated together or none; here ``model_without_ddp``
(the unwrapped module read after the wrap) keeps the whole program unchanged.
"""

import argparse

import torch
import torch.nn as nn

from engine import evaluate, train_one_epoch
from util.misc import NativeScalerWithGradNormCount as NativeScaler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--min_lr", type=float, default=1e-4)
    parser.add_argument("--warmup_epochs", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--accum_iter", type=int, default=2)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 3))
    model_without_ddp = model
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95))
    loss_scaler = NativeScaler()
    generator = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(8, 6, generator=generator), torch.randint(0, 3, (8,), generator=generator)) for _ in range(5)
    ]
    for epoch in range(args.epochs):
        train_one_epoch(model, batches, optimizer, epoch, loss_scaler, args)
        print("val", repr(evaluate(batches[:2], model)))
    checkpoint = {"model": model_without_ddp.state_dict(), "scaler": loss_scaler.state_dict()}
    print("saved", sorted(checkpoint))
    print("final scale", loss_scaler.state_dict()["scale"])


if __name__ == "__main__":
    main()
