"""Shape: the optimizer handed to a trainer's step method (issue 10, shape 1).

``engine.py``'s ``Trainer.train_step(self, batch, optimizer, max_norm=None)`` does the
forward, the backward and the step of whatever optimizer it is handed; ``Trainer.fit`` calls
it as ``self.train_step(batch, optimizer, ...)`` with the optimizer the script built and
passed to ``fit``. Hard: the optimizer reaches the step through two method parameters, in
another file, and the model through the constructor.
"""

import torch
import torch.nn as nn

from engine import Trainer


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(3)
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(6)]
    model = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(model)
    trainer.fit(batches, optimizer)
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
