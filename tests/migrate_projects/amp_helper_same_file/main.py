"""Shape: an AMP helper class with separate methods, in the training script (issue 10, shape 2).

``MixedPrecision`` builds its GradScaler inline (``scaler if scaler is not None else
GradScaler(...)``) and exposes ``backward``, ``unscale``, ``step`` and ``update`` as separate
methods, plus the scaler's state; ``describe`` logs the scale. The loop accumulates two
micro-batches per update, clips by value between ``unscale`` and ``step`` under a clipping
flag (``--clip 0``: no unscale, the step unscales), and resumes from a
checkpoint holding the helper's state. Hard: the step, the update and the zeroing are three
separate calls, and the gradients of two backwards meet in one step.
"""

import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger(__name__)


class MixedPrecision:
    def __init__(self, scaler=None, log_every=2):
        self.log_every = log_every
        self.scaler = scaler if scaler is not None else torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=3)

    def backward(self, loss):
        """Backpropagate the scaled loss."""
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer):
        self.scaler.unscale_(optimizer)

    def step(self, optimizer):
        self.scaler.step(optimizer)

    def update(self):
        logger.debug("scale before update %s", self.scaler.get_scale())
        self.scaler.update()

    def describe(self):
        return f"scale {self.scaler.get_scale()!r}"

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict):
        self.scaler.load_state_dict(state_dict)


def train(model, optimizer, amp, batches, accum, clip):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y) / accum
        amp.backward(loss)
        if (i + 1) % accum == 0:
            if clip > 0:
                amp.unscale(optimizer)
                torch.nn.utils.clip_grad_value_(model.parameters(), clip)
            amp.step(optimizer)
            amp.update()
            optimizer.zero_grad()
            print(f"step {i // accum} loss {loss.item()!r} {amp.describe()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum", type=int, default=2)
    parser.add_argument("--clip", type=float, default=0.05)
    args = parser.parse_args()
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(10)]
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    amp = MixedPrecision()
    train(model, optimizer, amp, batches, args.accum, args.clip)
    checkpoint = {"amp": amp.state_dict(), "optimizer": optimizer.state_dict()}
    amp.load_state_dict(checkpoint["amp"])
    train(model, optimizer, amp, batches[:4], args.accum, args.clip)
    print(f"final scale {amp.state_dict()['scale']!r}")


if __name__ == "__main__":
    main()
