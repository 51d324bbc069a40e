"""detectron2-style trainers in a module with a logger, defaults and a self-test of its own."""

import logging

import torch

logger = logging.getLogger("train_loop")
DEFAULTS = {"init_scale": 256.0, "growth_interval": 2}


class SimpleTrainer:
    def __init__(self, model, data_loader, optimizer):
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.iter = 0

    def train(self, max_iter):
        logger.info("training for %d iterations", max_iter)
        for self.iter in range(max_iter):
            losses = self.run_step()
            print(f"step {self.iter} loss {losses.item()!r}")


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, data_loader, optimizer, grad_scaler=None):
        super().__init__(model, data_loader, optimizer)
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler("cpu", **DEFAULTS)
        self.grad_scaler = grad_scaler

    def run_step(self):
        data = self.data_loader[self.iter]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_dict = self.model(*data)
            losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        return losses


def main():
    logger.info("train_loop has no command line of its own")


if __name__ == "__main__":
    main()
