"""fairseq-style optimizers: a plain wrapper and an AMP wrapper owning the GradScaler, with
an inverse-square-root schedule that sets the lr on every update."""

import torch


class FairseqAdam:
    def __init__(self, params, lr):
        self.params = list(params)
        self.optimizer = torch.optim.Adam(self.params, lr=lr, betas=(0.9, 0.98), eps=1e-8)

    def backward(self, loss):
        loss.backward()

    def multiply_grads(self, c):
        for p in self.params:
            if p.grad is not None:
                p.grad.data.mul_(c)

    def clip_grad_norm(self, max_norm):
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad()

    def get_lr(self):
        return self.optimizer.param_groups[0]["lr"]

    def set_lr(self, lr):
        for param_group in self.optimizer.param_groups:
            param_group["lr"] = lr

    def state_dict(self):
        return self.optimizer.state_dict()


class AMPOptimizer(FairseqAdam):
    def __init__(self, params, lr, init_scale=2.0**7, scale_window=2):
        super().__init__(params, lr)
        self._grad_scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=scale_window)

    def backward(self, loss):
        self._grad_scaler.scale(loss).backward()

    def multiply_grads(self, c):
        self._multiply_factor = c

    def clip_grad_norm(self, max_norm):
        self._grad_scaler.unscale_(self.optimizer)
        super().multiply_grads(self._multiply_factor)
        return torch.nn.utils.clip_grad_norm_(self.params, max_norm)

    def step(self):
        self._grad_scaler.step(self.optimizer)
        self._grad_scaler.update()

    @property
    def scaler(self):
        return self._grad_scaler

    def state_dict(self):
        state = super().state_dict()
        state["loss_scale"] = self._grad_scaler.get_scale()
        return state


class InverseSquareRootSchedule:
    def __init__(self, optimizer, lr, warmup_updates, warmup_init_lr=1e-7):
        self.optimizer = optimizer
        self.lr_step = (lr - warmup_init_lr) / warmup_updates
        self.decay_factor = lr * warmup_updates**0.5
        self.warmup_updates = warmup_updates
        self.warmup_init_lr = warmup_init_lr

    def step_update(self, num_updates):
        if num_updates < self.warmup_updates:
            self.lr = self.warmup_init_lr + num_updates * self.lr_step
        else:
            self.lr = self.decay_factor * num_updates**-0.5
        self.optimizer.set_lr(self.lr)
        return self.lr
