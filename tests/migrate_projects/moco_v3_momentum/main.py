"""Shape: MoCo v3's ``main_moco.py`` (held-out round; a momentum encoder updated in forward).

``moco.builder.MoCo`` holds a base encoder, a predictor and a momentum encoder whose
parameters do not require gradients; its ``forward(x1, x2, m)`` first moves the momentum
encoder towards the base encoder's current weights (under ``torch.no_grad()``), then encodes
the keys and returns the symmetric contrastive loss. ``main_worker`` builds the model, the
project's own ``LARS`` or ``AdamW`` over ``model.parameters()`` (the frozen momentum
parameters included), and ``torch.amp.GradScaler``; ``train`` sets the learning rate per
iteration through ``adjust_learning_rate`` (a cosine after warm-up, written into every group
before the forward), the momentum through ``adjust_moco_momentum``, runs the model under
autocast, logs ``loss.item()``, then ``zero_grad``, scaled backward, step, update. The
checkpoint holds the model, the optimizer and the scaler. Hard: the forward reads the
weights the previous step wrote and writes other parameters of the model.
"""

import argparse
import io
import math

import torch
import torch.nn as nn

import moco.builder
import moco.optimizer


class TinyResNet(nn.Module):
    def __init__(self, num_classes=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(6, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.stem(x), 1))


def adjust_learning_rate(optimizer, epoch, args):
    """Decays the learning rate with half-cycle cosine after warmup"""
    if epoch < args.warmup_epochs:
        lr = args.lr * epoch / args.warmup_epochs
    else:
        lr = (
            args.lr
            * 0.5
            * (1.0 + math.cos(math.pi * (epoch - args.warmup_epochs) / (args.epochs - args.warmup_epochs)))
        )
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    return lr


def adjust_moco_momentum(epoch, args):
    """Adjust moco momentum based on current epoch"""
    return 1.0 - 0.5 * (1.0 + math.cos(math.pi * epoch / args.epochs)) * (1.0 - args.moco_m)


def train(train_loader, model, optimizer, scaler, epoch, args):
    model.train()
    iters_per_epoch = len(train_loader)
    moco_m = args.moco_m
    for i, (images, _) in enumerate(train_loader):
        lr = adjust_learning_rate(optimizer, epoch + i / iters_per_epoch, args)
        if args.moco_m_cos:
            moco_m = adjust_moco_momentum(epoch + i / iters_per_epoch, args)

        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(images[0], images[1], moco_m)

        step = epoch * iters_per_epoch + i
        print(f"step {step} loss {loss.item()!r} lr {lr!r} moco_m {moco_m!r}")

        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()


def save_checkpoint(state, buffer):
    torch.save(state, buffer)


def make_loader(n, seed):
    gen = torch.Generator().manual_seed(seed)
    loader = []
    for _ in range(n):
        base = torch.randn(6, 3, 6, 6, generator=gen)
        loader.append(([base + 0.2 * torch.randn(base.shape, generator=gen) for _ in range(2)], None))
    return loader


def main_worker(args):
    torch.manual_seed(0)
    model = moco.builder.MoCo(TinyResNet, args.moco_dim, args.moco_mlp_dim, args.moco_t)
    args.lr = args.lr * args.batch_size / 256
    if args.optimizer == "lars":
        optimizer = moco.optimizer.LARS(
            model.parameters(), args.lr, weight_decay=args.weight_decay, momentum=args.momentum
        )
    elif args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), args.lr, weight_decay=args.weight_decay)
    scaler = torch.amp.GradScaler("cpu", growth_interval=4)
    train_loader = make_loader(2, seed=9)
    for epoch in range(args.start_epoch, args.epochs):
        train(train_loader, model, optimizer, scaler, epoch, args)
        save_checkpoint(
            {
                "epoch": epoch + 1,
                "state_dict": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
            },
            io.BytesIO(),
        )
    momentum_norm = sum(p.detach().float().norm().item() for p in model.momentum_encoder.parameters())
    print(f"momentum encoder norm {momentum_norm!r}")
    print(f"final scale {scaler.get_scale()!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--start-epoch", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.6)
    parser.add_argument("--weight-decay", type=float, default=1e-6)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--moco-dim", type=int, default=8)
    parser.add_argument("--moco-mlp-dim", type=int, default=16)
    parser.add_argument("--moco-m", type=float, default=0.99)
    parser.add_argument("--moco-m-cos", action="store_true")
    parser.add_argument("--moco-t", type=float, default=1.0)
    parser.add_argument("--warmup-epochs", type=int, default=1)
    parser.add_argument("--optimizer", default="lars", choices=["lars", "adamw"])
    main_worker(parser.parse_args())


if __name__ == "__main__":
    main()
