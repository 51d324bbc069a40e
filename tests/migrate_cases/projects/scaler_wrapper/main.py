"""Project rule: no silent misses. This file drives its training through the wrapper class
of amp_utils.py and mentions no GradScaler itself; it builds the wrapper where the model
is a parameter and no optimizer is built, so the migrated wrapper could not be given its
RoundPipe model: refused (RPM111), not passed over."""

import torch

from amp_utils import NativeScalerWithGradNormCount as NativeScaler


def train(model, optimizer, loader):
    loss_scaler = NativeScaler()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        loss_scaler(loss, optimizer, parameters=model.parameters())
        optimizer.zero_grad()
