"""A polynomial learning-rate schedule with linear warm-up, as an ``LRScheduler`` subclass
stepped before each optimizer step."""

from torch.optim.lr_scheduler import LRScheduler


class PolyWarmUpScheduler(LRScheduler):
    def __init__(self, optimizer, warmup, total_steps, degree=0.5, last_epoch=-1):
        self.warmup = warmup
        self.total_steps = total_steps
        self.degree = degree
        super().__init__(optimizer, last_epoch)

    def step(self, epoch=None):
        param_group = self.optimizer.param_groups[0]
        self.last_epoch = param_group["step"] + 1 if "step" in param_group else self.last_epoch + 1
        for param_group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            param_group["lr"] = lr

    def get_lr(self):
        progress = self.last_epoch / self.total_steps
        if progress < self.warmup:
            return [base_lr * progress / self.warmup for base_lr in self.base_lrs]
        return [base_lr * ((1.0 - progress) ** self.degree) for base_lr in self.base_lrs]

