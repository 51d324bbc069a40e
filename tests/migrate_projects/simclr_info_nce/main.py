"""Shape: SimCLR's trainer class (held-out round; contrastive views, logits used after the step).

``main.py`` parses the flags, builds a ResNet-like encoder with a projection head, Adam and a
cosine scheduler, and hands them by keyword to ``simclr.SimCLR``. Its ``train`` builds a
local ``GradScaler(enabled=args.fp16_precision)``, concatenates the two views of each batch,
runs the model and ``info_nce_loss`` (a method building the similarity logits from the
features) under ``torch.autocast(enabled=...)``, then ``zero_grad``, scaled backward, step,
update; every ``log_every_n_steps`` iterations top-1/top-5 come from the logits of the step;
the scheduler steps once per epoch after the first. Hard: the loss is a method of the trainer
fed by the model's output, the logits outlive the step, and the scaler is switched by a flag.
"""

import argparse

import torch
import torch.nn as nn

from simclr import SimCLR


class ResNetSimCLR(nn.Module):
    def __init__(self, out_dim=8):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, out_dim))

    def forward(self, x):
        return self.head(self.backbone(x))


def make_loader(n, batch_size, n_views, seed):
    gen = torch.Generator().manual_seed(seed)
    loader = []
    for _ in range(n):
        base = torch.randn(batch_size, 3, 6, 6, generator=gen)
        views = [base + 0.1 * torch.randn(base.shape, generator=gen) for _ in range(n_views)]
        loader.append((views, torch.zeros(batch_size, dtype=torch.long)))
    return loader


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=6)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--fp16-precision", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--temperature", type=float, default=0.07)
    parser.add_argument("--n-views", type=int, default=2)
    parser.add_argument("--log-every-n-steps", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    train_loader = make_loader(3, args.batch_size, args.n_views, seed=5)
    model = ResNetSimCLR(out_dim=8)
    optimizer = torch.optim.Adam(model.parameters(), args.lr, weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=len(train_loader), eta_min=0, last_epoch=-1)
    simclr = SimCLR(model=model, optimizer=optimizer, scheduler=scheduler, args=args)
    simclr.train(train_loader)


if __name__ == "__main__":
    main()
