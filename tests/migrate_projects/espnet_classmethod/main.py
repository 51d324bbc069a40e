"""Shape: an ESPnet-style task and trainer (held-out round; class methods, lists of optimizers).

``trainer.Trainer`` is never instantiated: ``run`` (a class method) builds ``scaler =
GradScaler(...) if use_amp else None`` and calls ``cls.train_one_epoch(model=...,
optimizers=..., schedulers=..., scaler=..., options=...)`` by keyword, once per epoch.
The model's ``forward(**batch)`` returns a dict with the loss and its stats; the loss is
divided by ``accum_grad`` under an ``autocast(enabled)`` context manager written as a
generator; the backward takes the scaler or the plain path; every ``accum_grad``
iterations the scaler unscales each optimizer of the list, the grad norm is clipped and,
when it is not finite, a warning is logged and ``scaler.step``/``update`` still run for each
optimizer (the step skips); otherwise each optimizer steps with its per-iteration
scheduler (``zip(optimizers, schedulers)``); epoch schedulers step in ``run``. Hard: the
objects come as lists through class-method parameters, the step is chosen by a finite
check, and several optimizers share a scaler updated inside their loop.
"""

import argparse

import torch
import torch.nn as nn

from trainer import Trainer


class TinyASR(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(5, 12), nn.LayerNorm(12), nn.ReLU())
        self.ctc = nn.Linear(12, 4)

    def forward(self, speech, text):
        logits = self.ctc(self.encoder(speech))
        loss = nn.functional.cross_entropy(logits.float(), text)
        return {"loss": loss, "stats": {"loss": loss.detach()}}


def build_iterator(seed):
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for i in range(6):
        speech = torch.randn(6, 5, generator=gen)
        if i == 3:
            speech[0, 0] = float("inf")
        batches.append({"speech": speech, "text": torch.randint(0, 4, (6,), generator=gen)})
    return batches


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--accum-grad", type=int, default=2)
    parser.add_argument("--grad-clip", type=float, default=5.0)
    parser.add_argument("--max-epoch", type=int, default=2)
    parser.add_argument("--use-amp", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = TinyASR()
    optimizers = [torch.optim.Adam(model.parameters(), lr=2e-3)]
    schedulers = [torch.optim.lr_scheduler.LambdaLR(optimizers[0], lambda step: min(1.0, (step + 1) / 3))]
    Trainer.run(model, optimizers, schedulers, build_iterator(4), Trainer.build_options(args))


if __name__ == "__main__":
    main()
