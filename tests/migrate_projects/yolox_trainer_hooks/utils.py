"""YOLOX's helpers: a model EMA and a meter of the latest values."""

import math
from copy import deepcopy

import torch


def is_parallel(model):
    return isinstance(model, (torch.nn.parallel.DataParallel, torch.nn.parallel.DistributedDataParallel))


class ModelEMA:
    """An exponential moving average of every floating-point entry of the model's state."""

    def __init__(self, model, decay=0.9999, updates=0):
        self.ema = deepcopy(model.module if is_parallel(model) else model).eval()
        self.updates = updates
        self.decay = lambda x: decay * (1 - math.exp(-x / 20))
        for p in self.ema.parameters():
            p.requires_grad_(False)

    def update(self, model):
        with torch.no_grad():
            self.updates += 1
            d = self.decay(self.updates)
            msd = model.module.state_dict() if is_parallel(model) else model.state_dict()
            for k, v in self.ema.state_dict().items():
                if v.dtype.is_floating_point:
                    v *= d
                    v += (1.0 - d) * msd[k].detach()


class MeterBuffer(dict):
    def update(self, values=None, **kwargs):
        for k, v in {**(values or {}), **kwargs}.items():
            self[k] = v.item() if isinstance(v, torch.Tensor) else v
