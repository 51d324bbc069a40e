"""Shape: the two-path backward split in a trainer class (issue 10, shape 4).

``Trainer.train_step`` (``trainer.py``) holds its state on ``self``, writes the plain path
first (``if not self.amp: loss.backward() else: self.scaler.scale(loss).backward()``),
divides the loss for gradient accumulation before the ``if``, and steps through one shared
``self.scaler.step(self.optimizer)`` under ``if (i + 1) % self.accum == 0`` (the scaler is
built with ``enabled=amp``, so it steps plainly on the plain path). Hard: a NaN check and the
logged value read the loss between the forward and the backward, so the forward stays on the
main thread (the autograd form); the plain path must keep working (``--no-amp``).
"""

import argparse

import torch
import torch.nn as nn

from trainer import Trainer


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-amp", dest="amp", action="store_false")
    args = parser.parse_args()
    torch.manual_seed(0)
    trainer = Trainer(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)), amp=args.amp, accum=2)
    gen = torch.Generator().manual_seed(5)
    for step in range(8):
        x = torch.randn(12, 6, generator=gen)
        y = x[:, :2].sum(dim=1, keepdim=True) - 0.4 * x[:, 3:4]
        print(f"step {step} loss {trainer.train_step(step, x, y)!r}")
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
