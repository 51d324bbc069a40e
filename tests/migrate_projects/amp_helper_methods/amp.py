"""The project's AMP helper: a small class owning the GradScaler behind separate methods."""

import torch


class AMPScaler:
    """Scales the loss, unscales before clipping, steps and updates the scale."""

    def __init__(self, enabled=True, scaler=None):
        self.scaler = scaler or torch.amp.GradScaler("cpu", init_scale=2.0**10, enabled=enabled)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def backward(self, loss):
        self.scaler.scale(loss).backward()

    def unscale(self, optimizer):
        # clipping needs the true gradients
        self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer):
        self.scaler.step(optimizer)
        self.scaler.update()

    def get_scale(self):
        return self.scaler.get_scale()

    def state_dict(self):
        return self.scaler.state_dict()

    def load_state_dict(self, state_dict):
        self.scaler.load_state_dict(state_dict)
