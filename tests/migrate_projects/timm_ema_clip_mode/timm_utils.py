"""timm-style helpers: a loss scaler dispatching the clip mode, a model EMA and a
per-update scheduler, as ``timm.utils`` / ``timm.scheduler`` organise them."""

from copy import deepcopy

import torch


def adaptive_clip_grad(parameters, clip_factor=0.01, eps=1e-3):
    for p in parameters:
        if p.grad is None:
            continue
        p_norm = p.detach().norm().clamp_(min=eps)
        g_norm = p.grad.detach().norm()
        max_norm = p_norm * clip_factor
        clipped = p.grad.detach() * (max_norm / g_norm.clamp(min=1e-6))
        p.grad.detach().copy_(torch.where(g_norm < max_norm, p.grad.detach(), clipped))


def dispatch_clip_grad(parameters, value, mode="norm"):
    if mode == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, value)
    elif mode == "value":
        torch.nn.utils.clip_grad_value_(parameters, value)
    elif mode == "agc":
        adaptive_clip_grad(parameters, clip_factor=value)
    else:
        raise ValueError(f"unknown clip mode {mode}")


class NativeScaler:
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.amp.GradScaler("cpu", init_scale=2.0**9, growth_interval=3)

    def __call__(
        self, loss, optimizer, clip_grad=None, clip_mode="norm", parameters=None, create_graph=False, need_update=True
    ):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if need_update:
            if clip_grad is not None:
                self._scaler.unscale_(optimizer)
                dispatch_clip_grad(parameters, clip_grad, mode=clip_mode)
            self._scaler.step(optimizer)
            self._scaler.update()

    def state_dict(self):
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict):
        self._scaler.load_state_dict(state_dict)


class ModelEmaV2(torch.nn.Module):
    def __init__(self, model, decay=0.9):
        super().__init__()
        self.module = deepcopy(model)
        self.module.eval()
        self.decay = decay

    @torch.no_grad()
    def _update(self, model, update_fn):
        for ema_v, model_v in zip(self.module.state_dict().values(), model.state_dict().values()):
            ema_v.copy_(update_fn(ema_v, model_v))

    def update(self, model):
        self._update(model, update_fn=lambda e, m: self.decay * e + (1.0 - self.decay) * m)


class StepLRScheduler:
    """Per-epoch decay with a linear warm-up counted in updates (``step_update``)."""

    def __init__(self, optimizer, decay_t, decay_rate, warmup_t, warmup_lr_init):
        self.optimizer = optimizer
        self.base_values = [group["lr"] for group in optimizer.param_groups]
        self.decay_t, self.decay_rate = decay_t, decay_rate
        self.warmup_t, self.warmup_lr_init = warmup_t, warmup_lr_init
        self.update_groups(self.warmup_lr_init if warmup_t else None)

    def _values(self, t):
        if t < self.warmup_t:
            return [self.warmup_lr_init + t * (v - self.warmup_lr_init) / self.warmup_t for v in self.base_values]
        return [v * (self.decay_rate ** (t // self.decay_t)) for v in self.base_values]

    def update_groups(self, value):
        if value is None:
            return
        values = value if isinstance(value, list) else [value] * len(self.optimizer.param_groups)
        for group, lr in zip(self.optimizer.param_groups, values):
            group["lr"] = lr

    def step(self, epoch):
        pass  # the warm-up and decay here count updates

    def step_update(self, num_updates):
        self.update_groups(self._values(num_updates))
