"""A loss-scaler wrapper class (the shape of timm's NativeScaler): the GradScaler lives on
`self`, which the migration does not follow (RPM105)."""

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
