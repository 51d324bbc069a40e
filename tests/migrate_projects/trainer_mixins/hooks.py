"""The pieces of a training iteration, as mixins (detectron2/MMEngine style)."""

import torch


class ForwardMixin:
    def forward_losses(self, batch):
        inputs, targets = batch
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.amp):
            logits = self.model(inputs)
            return {"ce": torch.nn.functional.cross_entropy(logits.float(), targets)}


class BackwardMixin:
    def backward(self, loss):
        self.grad_scaler.scale(loss).backward()


class UpdateMixin:
    def update_params(self):
        self.grad_scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.grad_scaler.step(self.optimizer)
        self.grad_scaler.update()
        self.optimizer.zero_grad()
        return norm
