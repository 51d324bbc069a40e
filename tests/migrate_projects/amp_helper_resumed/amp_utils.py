"""The AMP helper: it owns the GradScaler, the loop calls its methods one by one."""

import torch


class AMPScaler:
    def __init__(self, enabled=True):
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3, enabled=enabled)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss)

    def unscale(self, optimizer):
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
