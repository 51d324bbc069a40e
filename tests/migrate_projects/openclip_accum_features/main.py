"""Shape: OpenCLIP's ``train_one_epoch`` (held-out round; accumulation over cached features).

``main.py`` builds a two-tower model whose forward returns a dict (image and text features,
``logit_scale.exp()``), AdamW over two groups split by name and dimension (gains, biases and
``logit_scale`` without weight decay), ``scaler = GradScaler() if args.precision == "amp"
else None`` and a ``cosine_lr`` schedule: a closure that writes every group's ``lr`` when
called with the step number. ``train.py`` calls the schedule at the top of every iteration,
zeroes the gradients, and either runs one forward and the contrastive loss or, with
``accum_freq > 1``, first caches every batch's features under ``no_grad`` (``continue``
until the window is full) and then recomputes each batch's features with gradients,
splicing them into the cached ones; each loss goes through ``backward(total_loss,
scaler)``, a helper with a scaler path and a plain path. The step unscales and clips only
``if args.grad_clip_norm is not None``; after it ``unwrap_model(model).logit_scale.clamp_``
edits a parameter in place and the log reads ``logit_scale.item()``. Checkpoints keep the
scaler's state when there is one. Hard: a learning-rate write through a closure, a backward
reached through a helper, an in-place parameter edit after the step, several backwards per
step.
"""

import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from train import train_one_epoch, unwrap_model


class TinyCLIP(nn.Module):
    def __init__(self, embed_dim=4, vocab=10):
        super().__init__()
        self.visual = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.GELU(), nn.Linear(8, embed_dim))
        self.token_embedding = nn.Embedding(vocab, 8)
        self.text_projection = nn.Linear(8, embed_dim, bias=False)
        self.logit_scale = nn.Parameter(torch.ones([]) * np.log(1 / 0.07))

    def forward(self, image, text):
        image_features = F.normalize(self.visual(image), dim=-1)
        text_features = F.normalize(self.text_projection(self.token_embedding(text).mean(dim=1)), dim=-1)
        return {"image_features": image_features, "text_features": text_features, "logit_scale": self.logit_scale.exp()}


class ClipLoss(nn.Module):
    def forward(self, image_features, text_features, logit_scale, output_dict=False):
        logits_per_image = logit_scale * image_features @ text_features.T
        labels = torch.arange(logits_per_image.shape[0])
        total = (
            F.cross_entropy(logits_per_image.float(), labels) + F.cross_entropy(logits_per_image.T.float(), labels)
        ) / 2
        return {"contrastive_loss": total} if output_dict else total


def assign_learning_rate(optimizer, new_lr):
    for param_group in optimizer.param_groups:
        param_group["lr"] = new_lr


def cosine_lr(optimizer, base_lr, warmup_length, steps):
    def _lr_adjuster(step):
        if step < warmup_length:
            lr = base_lr * (step + 1) / warmup_length
        else:
            e = step - warmup_length
            lr = 0.5 * (1 + math.cos(math.pi * e / (steps - warmup_length))) * base_lr
        assign_learning_rate(optimizer, lr)
        return lr

    return _lr_adjuster


def make_data(n, batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(batch_size, 6, generator=gen), torch.randint(0, 10, (batch_size, 5), generator=gen))
        for _ in range(n)
    ]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--precision", default="amp", choices=["amp", "fp32"])
    parser.add_argument("--accum-freq", type=int, default=2)
    parser.add_argument("--grad-clip-norm", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--wd", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--skip-scheduler", action="store_true")
    parser.add_argument("--log-every-n-steps", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = TinyCLIP()
    data = make_data(6, 4, seed=11)

    exclude = lambda n, p: p.ndim < 2 or "bn" in n or "ln" in n or "bias" in n or "logit_scale" in n
    include = lambda n, p: not exclude(n, p)
    named_parameters = list(model.named_parameters())
    gain_or_bias_params = [p for n, p in named_parameters if exclude(n, p) and p.requires_grad]
    rest_params = [p for n, p in named_parameters if include(n, p) and p.requires_grad]
    optimizer = torch.optim.AdamW(
        [{"params": gain_or_bias_params, "weight_decay": 0.0}, {"params": rest_params, "weight_decay": args.wd}],
        lr=args.lr,
        betas=(0.9, 0.98),
        eps=1e-6,
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2) if args.precision == "amp" else None
    total_steps = (len(data) // args.accum_freq) * args.epochs
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, total_steps)
    loss = ClipLoss()

    for epoch in range(args.epochs):
        train_one_epoch(model, data, loss, epoch, optimizer, scaler, scheduler, args)
        checkpoint_dict = {
            "epoch": epoch + 1,
            "state_dict": unwrap_model(model).state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        if scaler is not None:
            checkpoint_dict["scaler"] = scaler.state_dict()
        print(
            f"epoch {epoch} logit_scale {checkpoint_dict['state_dict']['logit_scale'].item()!r} lr {optimizer.param_groups[0]['lr']!r}"
        )
    print(f"final scale {scaler.get_scale() if scaler is not None else None!r} clamp {math.log(100)!r}")


if __name__ == "__main__":
    main()
