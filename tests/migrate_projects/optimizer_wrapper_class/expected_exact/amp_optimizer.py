"""An optimizer wrapper that owns the loss scaler (fairseq's AMP optimizer, in spirit),
migrated by hand to RoundPipe with the same interface.

The wrapper is given the RoundPipe model it steps. ``backward`` stays on the caller's thread
(RoundPipe's autograd form); ``clip_grad_norm`` runs in a ``model.step`` that hands the
gradients to the optimizer copies and returns the norm measured on them; ``step`` runs the
scaler's step in a second ``model.step`` (no gradients left to hand over: the copies keep the
unscaled, clipped ones), then updates the scale on the caller's thread. Both steps are waited
for, so the caller reads the norm when the call returns, as before.
"""

import roundpipe
import torch


class AMPOptimizer:
    """Wraps a torch optimizer: ``backward`` scales, ``clip_grad_norm`` unscales and clips,
    ``step`` steps through the scaler and updates the scale."""

    def __init__(self, params, lr, init_scale=2.0**7, scale_window=2, *, model):
        self._model = model
        self.params = list(params)
        self.fp32_optimizer = torch.optim.Adam(self.params, lr=lr, eps=1e-6)
        self._grad_scaler = roundpipe.GradScaler(init_scale=init_scale, growth_interval=scale_window)

    def backward(self, loss):
        self._grad_scaler.scale(loss).backward()

    def clip_grad_norm(self, max_norm):
        norm = None

        def _step_fn():
            nonlocal norm
            self._grad_scaler.unscale_(self.fp32_optimizer)
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)

        self._model.step(_step_fn, is_async=False)
        return norm

    def step(self):
        def _step_fn():
            self._grad_scaler.step(self.fp32_optimizer)

        self._model.step(_step_fn, is_async=False)
        self._grad_scaler.update()

    def zero_grad(self):
        self._model.zero_grad()
        self.fp32_optimizer.zero_grad()

    def get_loss_scale(self):
        return self._grad_scaler.get_scale()

    def state_dict(self):
        state = self.fp32_optimizer.state_dict()
        state["loss_scaler"] = self._grad_scaler.state_dict()
        return state
