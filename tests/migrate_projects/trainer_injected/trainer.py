"""A small Hugging Face-style trainer: objects are injected or built when not given."""

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def linear_warmup(optimizer, warmup_steps, total_steps):
    def factor(step):
        if step < warmup_steps:
            return float(step + 1) / float(max(1, warmup_steps))
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))

    return LambdaLR(optimizer, factor)


class TrainingArguments:
    def __init__(self, learning_rate=5e-3, max_steps=8, warmup_steps=2, max_grad_norm=1.0, bf16=True, logging_steps=1):
        self.learning_rate = learning_rate
        self.max_steps = max_steps
        self.warmup_steps = warmup_steps
        self.max_grad_norm = max_grad_norm
        self.bf16 = bf16
        self.logging_steps = logging_steps


class Trainer:
    def __init__(self, model, args, train_batches, optimizer=None, lr_scheduler=None, scaler=None):
        self.model = model
        self.args = args
        self.train_batches = train_batches
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        if scaler is None:
            scaler = torch.amp.GradScaler("cpu", enabled=args.bf16)
        self.scaler = scaler
        self.state = {"global_step": 0, "log_history": []}

    def create_optimizer_and_scheduler(self):
        if self.optimizer is None:
            self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate)
        if self.lr_scheduler is None:
            self.lr_scheduler = linear_warmup(self.optimizer, self.args.warmup_steps, self.args.max_steps)

    def compute_loss(self, model, inputs):
        outputs = model(inputs["input"])
        return torch.nn.functional.mse_loss(outputs.float(), inputs["labels"])

    def training_step(self, model, inputs):
        model.train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.args.bf16):
            loss = self.compute_loss(model, inputs)
        self.scaler.scale(loss).backward()
        return loss.detach()

    def optimizer_step(self):
        self.scaler.unscale_(self.optimizer)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.lr_scheduler.step()
        self.model.zero_grad()

    def train(self):
        self.create_optimizer_and_scheduler()
        for inputs in self.train_batches[: self.args.max_steps]:
            tr_loss = self.training_step(self.model, inputs)
            self.optimizer_step()
            self.state["global_step"] += 1
            if self.state["global_step"] % self.args.logging_steps == 0:
                self.state["log_history"].append(tr_loss.item())
                print(f"step {self.state['global_step']} loss {tr_loss.item()!r}")
        return self.state
