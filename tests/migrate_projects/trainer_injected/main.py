"""Shape: a trainer class with injected objects (issue 10, shape 1).

``trainer.py`` holds a Hugging Face-style ``Trainer(model, args, ..., optimizer=None,
lr_scheduler=None, scaler=None)``: the scaler is built in ``__init__`` when the caller passes
none, the optimizer and scheduler lazily in a method; ``training_step`` does the forward
(through ``compute_loss``) and the backward, ``optimizer_step`` the rest, and ``zero_grad``
goes through the model. Hard: creation, backward and step live in three methods of a class
in another file, and ``main.py`` may inject its own scaler.
"""

import torch
import torch.nn as nn

from trainer import Trainer, TrainingArguments


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))
    gen = torch.Generator().manual_seed(4)
    batches = [{"input": torch.randn(8, 6, generator=gen), "labels": torch.randn(8, 2, generator=gen)} for _ in range(8)]
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    trainer = Trainer(model, TrainingArguments(), batches, scaler=scaler)
    trainer.train()
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
