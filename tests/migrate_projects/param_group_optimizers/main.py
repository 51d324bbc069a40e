"""Shape: optimizers built by helpers from parameter groups (issue 10, shape 8).

``optim_factory.py`` builds decay/no-decay groups from ``named_parameters()`` (skipping
frozen parameters) or layer-wise groups with an ``lr_scale`` per group; the loop writes
``param_group["lr"] = lr * param_group["lr_scale"]`` every iteration. Two models train, one
per helper. Hard: the groups must map onto the optimizer copies by identity, every group
option kept, and the hand-written lr schedule touches optimizer state on the main thread.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from optim_factory import create_optimizer


class Encoder(nn.Module):
    def __init__(self, dim=8, depth=3):
        super().__init__()
        self.embed = nn.Linear(5, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.GELU()) for _ in range(depth))
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def train(model, optimizer, scaler, batches, base_lr, tag):
    for step, (x, y) in enumerate(batches):
        lr = base_lr * min(1.0, (step + 1) / 3)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr * param_group.get("lr_scale", 1.0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item()!r} model {tag}")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(17)
    batches = [(torch.randn(10, 5, generator=gen), torch.randn(10, 2, generator=gen)) for _ in range(5)]
    plain = Encoder()
    plain.embed.requires_grad_(False)  # frozen: no group takes it
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    train(plain, create_optimizer(plain, lr=1e-2, weight_decay=0.05), scaler, batches, 1e-2, "decay")
    layered = Encoder()
    scaler2 = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    train(layered, create_optimizer(layered, lr=1e-2, weight_decay=0.05, layer_decay=0.7), scaler2, batches, 1e-2, "layer")
    print(f"final scale {scaler.get_scale()!r} {scaler2.get_scale()!r}")


if __name__ == "__main__":
    main()
