"""Shapes 1 and 8: a trainer class whose optimizer is built by a factory of another module
(``self.optimizer = build_optimizer(cfg, self.model)``), the model handed to the constructor,
the scaler built in either branch of an ``if`` (dynamic or fixed scale), and the step written
on locals read from the attributes (``model, optimizer = self.model, self.optimizer``;
``scaler = self.scaler``). Hard: the factory groups the parameters by name, so the model
cannot simply be given ``optim_parameters()``; the optimizer is moved onto RoundPipe's copies
by identity; the locals are the attributes' objects; a learning-rate write in another method
races with an asynchronous step."""

import sys

import torch

from optim_factory import build_optimizer


class Trainer:
    def __init__(self, cfg, model):
        self.model = model
        self.optimizer = build_optimizer(cfg, self.model)
        if cfg["dynamic_scale"]:
            self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=2)
        else:
            self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**6, growth_interval=10**9)
        self.steps = 0

    def scale_head_lr(self):
        for group in self.optimizer.param_groups:
            group["lr"] = group["lr"] * group.get("lr_scale", 1.0)

    def train_step(self, x, y):
        model, optimizer = self.model, self.optimizer
        scaler = self.scaler
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        self.steps += 1
        return loss.item()


def main(argv):
    torch.manual_seed(0)
    cfg = {
        "optimizer": argv[0] if argv else "adamw",
        "lr": 0.02,
        "weight_decay": 0.05,
        "head_lr_scale": 0.5,
        "dynamic_scale": "fixed" not in argv,
    }
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 3))
    trainer = Trainer(cfg, model)
    gen = torch.Generator().manual_seed(5)
    for step in range(6):
        if step == 3:
            trainer.scale_head_lr()
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        print(f"step {step} loss {trainer.train_step(x, y)!r}")
    print(f"final scale {trainer.scaler.get_scale()!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
