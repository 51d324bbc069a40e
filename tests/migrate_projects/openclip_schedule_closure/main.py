"""Shape: an OpenCLIP fork's loop (held-out round 2; a schedule closure, groups by name).

The loop of OpenCLIP's ``train_one_epoch`` as forks that always train with AMP write it (no
plain path, no accumulation, no temperature clamp). ``main.py`` builds a two-tower model
whose forward returns a dict (image and text features, ``logit_scale.exp()``), AdamW over
two groups made in four steps (``named_parameters = list(model.named_parameters())``, then
gains/biases/``logit_scale`` and the rest filtered by an ``exclude`` lambda, then the list of
group dicts) and a ``cosine_lr`` schedule: a closure, built with the optimizer, that writes every
group's ``lr`` when called with the step number. ``train.py`` calls ``scheduler(step)`` at
the top of every iteration, zeroes the gradients, runs the forward and the contrastive loss
under ``get_autocast(args.precision)()`` (a ``functools.partial`` of autocast), unscales
and clips ``if args.grad_clip_norm is not None``, steps and updates; the log reads
``logit_scale.item()``. Hard: the groups reach the optimizer through several assignments,
and the closure's lr write at the top of the next iteration must wait for an asynchronous
step.
"""

import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from train import train_one_epoch


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
    parser.add_argument("--precision", default="amp", choices=["amp"])
    parser.add_argument("--grad-clip-norm", type=float, default=1.0)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=5e-3)
    parser.add_argument("--wd", type=float, default=0.2)
    parser.add_argument("--warmup", type=int, default=1)
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
    param_groups = [
        {"params": gain_or_bias_params, "weight_decay": 0.0},
        {"params": rest_params, "weight_decay": args.wd},
    ]
    optimizer = torch.optim.AdamW(param_groups, lr=args.lr, betas=(0.9, 0.98), eps=1e-6)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    total_steps = len(data) * args.epochs
    scheduler = cosine_lr(optimizer, args.lr, args.warmup, total_steps)
    loss = ClipLoss()

    for epoch in range(args.epochs):
        train_one_epoch(model, data, loss, epoch, optimizer, scaler, scheduler, args)
        checkpoint_dict = {
            "epoch": epoch + 1,
            "state_dict": model.state_dict(),
            "optimizer": optimizer.state_dict(),
        }
        checkpoint_dict["scaler"] = scaler.state_dict()
        print(
            f"epoch {epoch} logit_scale {checkpoint_dict['state_dict']['logit_scale'].item()!r} lr {optimizer.param_groups[0]['lr']!r}"
        )
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
