"""detectron2-style trainers: a base storing what it is handed, an AMP subclass."""

import torch
from torch.nn.parallel import DataParallel, DistributedDataParallel


class TrainerBase:
    def __init__(self):
        self.iter = 0
        self.history = []

    def train(self, max_iter):
        for self.iter in range(max_iter):
            losses = self.run_step()
            self.history.append(losses.item())
            print(f"step {self.iter} loss {losses.item()!r}")

    def run_step(self):
        raise NotImplementedError


class SimpleTrainer(TrainerBase):
    def __init__(self, model, data_loader, optimizer, zero_grad_before_forward=False):
        super().__init__()
        model.train()
        self.model = model
        self.data_loader = data_loader
        self.optimizer = optimizer
        self.zero_grad_before_forward = zero_grad_before_forward

    def run_step(self):
        data = self.data_loader[self.iter]
        if self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        loss_dict = self.model(*data)
        losses = sum(loss_dict.values())
        if not self.zero_grad_before_forward:
            self.optimizer.zero_grad()
        losses.backward()
        self.optimizer.step()
        return losses


class AMPTrainer(SimpleTrainer):
    def __init__(self, model, data_loader, optimizer, grad_scaler=None, precision=torch.bfloat16):
        unsupported = "AMPTrainer does not support single-process multi-device training!"
        if isinstance(model, DistributedDataParallel):
            assert not (model.device_ids and len(model.device_ids) > 1), unsupported
        assert not isinstance(model, DataParallel), unsupported
        super(AMPTrainer, self).__init__(model, data_loader=data_loader, optimizer=optimizer)
        if grad_scaler is None:
            grad_scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
        self.grad_scaler = grad_scaler
        self.precision = precision

    def run_step(self):
        data = self.data_loader[self.iter]
        with torch.autocast("cpu", dtype=self.precision):
            loss_dict = self.model(*data)
            losses = sum(loss_dict.values())
        self.optimizer.zero_grad()
        self.grad_scaler.scale(losses).backward()
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        return losses

    def state_dict(self):
        return {"iteration": self.iter, "grad_scaler": self.grad_scaler.state_dict()}
