"""Shape: two joined files binding the same top-level names each for itself (issue 10).

``train_loop.py`` (detectron2-style ``SimpleTrainer``/``AMPTrainer``) and this script each
bind their own ``logger``, ``DEFAULTS`` and ``main``. Hard: the script builds the trainer, so
both files are analysed as one program, where one file's ``main`` or ``DEFAULTS`` must not
shadow the other's.
"""

import logging

import torch
import torch.nn as nn

from train_loop import AMPTrainer

logger = logging.getLogger("main")
DEFAULTS = {"lr": 0.05, "momentum": 0.9, "steps": 6}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))

    def forward(self, x, y):
        out = self.body(x).float()
        return {"loss_mse": nn.functional.mse_loss(out, y), "loss_l1": 0.1 * (out - y).abs().mean()}


def main():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=DEFAULTS["lr"], momentum=DEFAULTS["momentum"])
    gen = torch.Generator().manual_seed(3)
    data = [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(DEFAULTS["steps"])]
    trainer = AMPTrainer(model, data, optimizer)
    logger.info("built %s", type(trainer).__name__)
    trainer.train(DEFAULTS["steps"])
    print(f"final scale {trainer.grad_scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
