"""An optimizer wrapper that owns the loss scaler (fairseq's AMP optimizer, in spirit)."""

import torch


class AMPOptimizer:
    """Wraps a torch optimizer: ``backward`` scales, ``clip_grad_norm`` unscales and clips,
    ``step`` steps through the scaler and updates the scale."""

    def __init__(self, params, lr, init_scale=2.0**7, scale_window=2):
        self.params = list(params)
        self.fp32_optimizer = torch.optim.Adam(self.params, lr=lr, eps=1e-6)
        self._grad_scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=scale_window)

    def backward(self, loss):
        self._grad_scaler.scale(loss).backward()

    def clip_grad_norm(self, max_norm):
        self._grad_scaler.unscale_(self.fp32_optimizer)
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def step(self):
        self._grad_scaler.step(self.fp32_optimizer)
        self._grad_scaler.update()

    def zero_grad(self):
        self.fp32_optimizer.zero_grad()

    def get_loss_scale(self):
        return self._grad_scaler.get_scale()

    def state_dict(self):
        state = self.fp32_optimizer.state_dict()
        state["loss_scaler"] = self._grad_scaler.state_dict()
        return state
