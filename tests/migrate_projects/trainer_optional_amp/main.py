"""Shape: a trainer with optional AMP chosen by a conditional ``with`` (issue 10, shapes 1,
4 and 5).

Medical-imaging style (nnU-Net-like): ``self.grad_scaler = GradScaler(...) if self.use_amp
else None`` in ``__init__``; ``train_step`` enters ``torch.autocast(...) if self.use_amp else
dummy_context()`` directly in the ``with`` statement, then takes the scaler path or the plain
path, both with clipping; the step returns a dict of numbers. Hard: the autocast is a
conditional expression in the ``with``, the scaler may be ``None``, and the harness runs
both paths.
"""

import argparse
from contextlib import nullcontext as dummy_context

import torch
import torch.nn as nn


class DiceCELoss(nn.Module):
    def forward(self, logits, target):
        probs = torch.softmax(logits.float(), dim=1)
        one_hot = nn.functional.one_hot(target, logits.shape[1]).float()
        dice = 1 - (2 * (probs * one_hot).sum() + 1e-5) / (probs.sum() + one_hot.sum() + 1e-5)
        return dice + nn.functional.cross_entropy(logits.float(), target)


class SegTrainer:
    def __init__(self, use_amp=True):
        self.use_amp = use_amp
        self.network = nn.Sequential(nn.Linear(8, 16), nn.GroupNorm(4, 16), nn.LeakyReLU(0.01), nn.Linear(16, 3))
        self.optimizer = torch.optim.SGD(self.network.parameters(), lr=0.01, momentum=0.99, nesterov=True, weight_decay=3e-5)
        self.loss = DiceCELoss()
        self.grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3) if self.use_amp else None

    def train_step(self, batch):
        data, target = batch
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if self.use_amp else dummy_context():
            output = self.network(data)
            l = self.loss(output, target)
        if self.grad_scaler is not None:
            self.grad_scaler.scale(l).backward()
            self.grad_scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.grad_scaler.step(self.optimizer)
            self.grad_scaler.update()
        else:
            l.backward()
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), 12)
            self.optimizer.step()
        return {"loss": l.detach().item()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--disable-amp", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    trainer = SegTrainer(use_amp=not args.disable_amp)
    gen = torch.Generator().manual_seed(27)
    for step in range(8):
        batch = (torch.randn(20, 8, generator=gen), torch.randint(0, 3, (20,), generator=gen))
        print(f"step {step} loss {trainer.train_step(batch)['loss']!r}")
    scale = trainer.grad_scaler.get_scale() if trainer.grad_scaler is not None else None
    print(f"final scale {scale!r}")


if __name__ == "__main__":
    main()
