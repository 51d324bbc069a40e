"""Shape: a YOLO-style detector trainer (issue 10, shapes 6, 7 and 8).

``train(hyp, opt)`` builds the optimizer with ``smart_optimizer`` (one group passed to the
constructor, two added with ``add_param_group``), a ``LambdaLR`` stepped once per epoch, and
``accumulate = max(round(nbs / batch_size), 1)``. Each iteration first writes every group's
``lr`` (and ``momentum``) by hand during warm-up (``np.interp`` over the iteration number),
runs the forward under ``torch.autocast(..., enabled=amp)``, gets ``loss, loss_items`` from
a loss object (the loss is the mean times the batch size), backpropagates the scaled loss,
and steps only when ``ni - last_opt_step >= accumulate`` (``last_opt_step = ni`` inside);
the running mean of the loss items is updated after the backward. Hard: hand-written lr
and momentum writes before the forward, a step condition on a counter the step itself
writes, and a loss of two values.
"""

import argparse
import math

import numpy as np
import torch
import torch.nn as nn

from utils import ComputeLoss, smart_optimizer


class TinyDetector(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def make_loader(n, batch_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        imgs = torch.randn(batch_size, 3, 8, 8, generator=gen)
        targets = torch.cat(
            (torch.rand(batch_size, 4, generator=gen), (torch.rand(batch_size, 1, generator=gen) > 0.5).float()), 1
        )
        batches.append((imgs, targets))
    return batches


def one_cycle(y1=0.0, y2=1.0, steps=100):
    return lambda x: ((1 - math.cos(x * math.pi / steps)) / 2) * (y2 - y1) + y1


def train(hyp, opt):
    torch.manual_seed(0)
    epochs, batch_size, amp = opt.epochs, opt.batch_size, not opt.no_amp
    model = TinyDetector()
    nbs = 8  # nominal batch size
    accumulate = max(round(nbs / batch_size), 1)
    hyp["weight_decay"] *= batch_size * accumulate / nbs
    optimizer = smart_optimizer(model, hyp["lr0"], hyp["momentum"], hyp["weight_decay"])
    lf = one_cycle(1, hyp["lrf"], epochs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lf)
    train_loader = make_loader(5, batch_size)
    nb = len(train_loader)
    nw = max(round(hyp["warmup_epochs"] * nb), 3)
    last_opt_step = -1
    scaler = torch.amp.GradScaler("cpu", enabled=amp, init_scale=2.0**8, growth_interval=2)
    compute_loss = ComputeLoss()
    for epoch in range(epochs):
        model.train()
        mloss = torch.zeros(2)
        optimizer.zero_grad()
        for i, (imgs, targets) in enumerate(train_loader):
            ni = i + nb * epoch  # number integrated batches (since train start)
            imgs = imgs.float()

            # Warmup
            if ni <= nw:
                xi = [0, nw]  # x interp
                accumulate = max(1, np.interp(ni, xi, [1, nbs / batch_size]).round())
                for j, x in enumerate(optimizer.param_groups):
                    # bias lr falls from 0.1 to lr0, all other lrs rise from 0.0 to lr0
                    x["lr"] = np.interp(ni, xi, [hyp["warmup_bias_lr"] if j == 0 else 0.0, x["initial_lr"] * lf(epoch)])
                    if "momentum" in x:
                        x["momentum"] = np.interp(ni, xi, [hyp["warmup_momentum"], hyp["momentum"]])

            # Forward
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                pred = model(imgs)  # forward
                loss, loss_items = compute_loss(pred, targets)  # loss scaled by batch_size

            # Backward
            scaler.scale(loss).backward()

            # Optimize
            if ni - last_opt_step >= accumulate:
                scaler.unscale_(optimizer)  # unscale gradients
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)  # clip gradients
                scaler.step(optimizer)  # optimizer.step
                scaler.update()
                optimizer.zero_grad()
                last_opt_step = ni

            mloss = (mloss * i + loss_items) / (i + 1)  # update mean losses
            print(f"step {ni} loss {loss.item()!r} mloss {mloss.tolist()!r} lr {optimizer.param_groups[1]['lr']!r}")

        # Scheduler
        lr = [x["lr"] for x in optimizer.param_groups]  # for loggers
        scheduler.step()
        print(f"epoch {epoch} lr {lr!r}")
    print(f"final scale {scaler.get_scale()!r}")


def parse_opt():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--no-amp", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    hyp = {
        "lr0": 0.01,
        "lrf": 0.1,
        "momentum": 0.937,
        "weight_decay": 0.0005,
        "warmup_epochs": 1.0,
        "warmup_momentum": 0.8,
        "warmup_bias_lr": 0.1,
    }
    train(hyp, parse_opt())
