"""A loss-scaler wrapper class (the shape of timm's NativeScaler), recognised; it migrates
only with the code that builds it, which is refused here (RPM110)."""

import torch


class NativeScalerWithGradNormCount:
    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, parameters):
        self._scaler.scale(loss).backward()
        self._scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        self._scaler.step(optimizer)
        self._scaler.update()
