"""YOLOX-style experiment description: it builds and caches the model, the optimizer, the
learning-rate schedule and the data."""

import math

import torch
import torch.nn as nn


class TinyDetector(nn.Module):
    """Returns YOLOX's dict of losses in training mode and the predictions otherwise."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.SiLU())
        self.head = nn.Linear(12, 5)

    def forward(self, x, targets=None):
        out = self.head(self.backbone(x))
        if not self.training:
            return out
        box, obj = out[:, :4], out[:, 4]
        iou_loss = (box.float() - targets[:, :4]).abs().mean()
        conf_loss = nn.functional.binary_cross_entropy_with_logits(obj.float(), targets[:, 4])
        total_loss = 5.0 * iou_loss + conf_loss
        return {
            "total_loss": total_loss,
            "iou_loss": iou_loss,
            "conf_loss": conf_loss,
            "num_fg": float(targets[:, 4].sum()),
        }


class LRScheduler:
    """Warm-up then cosine, by iteration; ``update_lr`` only computes the value."""

    def __init__(self, lr, iters_per_epoch, total_epochs, warmup_epochs, warmup_lr_start=0.0, min_lr_ratio=0.05):
        self.lr = lr
        self.total_iters = iters_per_epoch * total_epochs
        self.warmup_total_iters = iters_per_epoch * warmup_epochs
        self.warmup_lr_start = warmup_lr_start
        self.min_lr = lr * min_lr_ratio

    def update_lr(self, iters):
        if iters <= self.warmup_total_iters:
            return (self.lr - self.warmup_lr_start) * pow(
                iters / float(self.warmup_total_iters), 2
            ) + self.warmup_lr_start
        progress = (iters - self.warmup_total_iters) / (self.total_iters - self.warmup_total_iters)
        return self.min_lr + 0.5 * (self.lr - self.min_lr) * (1.0 + math.cos(math.pi * progress))


class Exp:
    def __init__(self):
        self.max_epoch = 3
        self.warmup_epochs = 1
        self.basic_lr_per_img = 0.01 / 8
        self.momentum = 0.9
        self.weight_decay = 5e-4
        self.print_interval = 2
        self.ema = True

    def get_model(self):
        if "model" not in self.__dict__:
            torch.manual_seed(0)
            self.model = TinyDetector()
        self.model.train()
        return self.model

    def get_optimizer(self, batch_size):
        if "optimizer" not in self.__dict__:
            lr = self.basic_lr_per_img * batch_size
            pg0, pg1, pg2 = [], [], []  # norm weights, other weights, biases
            for k, v in self.model.named_modules():
                if hasattr(v, "bias") and isinstance(v.bias, nn.Parameter):
                    pg2.append(v.bias)
                if isinstance(v, nn.BatchNorm1d) or "bn" in k:
                    pg0.append(v.weight)
                elif hasattr(v, "weight") and isinstance(v.weight, nn.Parameter):
                    pg1.append(v.weight)
            optimizer = torch.optim.SGD(pg0, lr=lr, momentum=self.momentum, nesterov=True)
            optimizer.add_param_group({"params": pg1, "weight_decay": self.weight_decay})
            optimizer.add_param_group({"params": pg2})
            self.optimizer = optimizer
        return self.optimizer

    def get_lr_scheduler(self, lr, iters_per_epoch):
        return LRScheduler(lr, iters_per_epoch, self.max_epoch, self.warmup_epochs)

    def get_data_loader(self, batch_size):
        gen = torch.Generator().manual_seed(3)
        loader = []
        for _ in range(4):
            x = torch.randn(batch_size, 6, generator=gen)
            targets = torch.cat(
                [torch.rand(batch_size, 4, generator=gen), (torch.rand(batch_size, 1, generator=gen) > 0.5).float()],
                dim=1,
            )
            loader.append((x, targets))
        return loader
