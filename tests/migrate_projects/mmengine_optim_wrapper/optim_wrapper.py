"""An mmengine-style optimizer wrapper: ``update_params(loss)`` does the whole update
(loss divided for accumulation, backward, clip, step, zero_grad), ``optim_context`` is the
context the forward runs in, and the AMP subclass owns a GradScaler."""

from contextlib import contextmanager

import torch


class OptimWrapper:
    def __init__(self, optimizer, accumulative_counts=1, clip_grad=None):
        self.optimizer = optimizer
        self._accumulative_counts = accumulative_counts
        self.clip_grad_kwargs = clip_grad
        self._inner_count = 0
        self._max_counts = -1

    def initialize_count_status(self, model, init_counts, max_counts):
        self._inner_count = init_counts
        self._max_counts = max_counts

    def should_update(self):
        return self._inner_count % self._accumulative_counts == 0 or self._inner_count == self._max_counts

    def scale_loss(self, loss):
        return loss / self._accumulative_counts

    def backward(self, loss, **kwargs):
        loss.backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs):
        if self.clip_grad_kwargs:
            self._clip_grad()
        self.optimizer.step(**kwargs)

    def _clip_grad(self):
        params = [p for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        return torch.nn.utils.clip_grad_norm_(params, **self.clip_grad_kwargs)

    def zero_grad(self, **kwargs):
        self.optimizer.zero_grad(**kwargs)

    def update_params(self, loss, step_kwargs=None, zero_kwargs=None):
        loss = self.scale_loss(loss)
        self.backward(loss)
        if self.should_update():
            self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))

    @contextmanager
    def optim_context(self, model):
        yield

    def get_lr(self):
        return {"lr": [group["lr"] for group in self.optimizer.param_groups]}

    def state_dict(self):
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict)


class AmpOptimWrapper(OptimWrapper):
    def __init__(self, loss_scale="dynamic", dtype=torch.bfloat16, **kwargs):
        super().__init__(**kwargs)
        self.cast_dtype = dtype
        if loss_scale == "dynamic":
            self.loss_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**7, growth_interval=2)
        else:
            self.loss_scaler = torch.amp.GradScaler("cpu", init_scale=loss_scale, growth_factor=1, backoff_factor=1)

    def backward(self, loss, **kwargs):
        self.loss_scaler.scale(loss).backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs):
        if self.clip_grad_kwargs:
            self.loss_scaler.unscale_(self.optimizer)
            self._clip_grad()
        self.loss_scaler.step(self.optimizer, **kwargs)
        self.loss_scaler.update()

    def state_dict(self):
        state_dict = self.optimizer.state_dict()
        state_dict["loss_scaler"] = self.loss_scaler.state_dict()
        return state_dict

    def load_state_dict(self, state_dict):
        if "loss_scaler" in state_dict:
            self.loss_scaler.load_state_dict(state_dict.pop("loss_scaler"))
        self.optimizer.load_state_dict(state_dict)

    @contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast("cpu", dtype=self.cast_dtype):
            yield
