"""The checkpoint helpers of checkpoint_refused: a Checkpointer keeps the scaler it is given
on `self` and unscales through it, which the migration does not follow (RPM104)."""

import torch


def save_optimizer(optimizer, path):
    torch.save({"optimizer": optimizer.state_dict()}, path)


class Checkpointer:
    def __init__(self, path):
        self.path = path
        self.scaler = None

    def save(self, scaler):
        self.scaler = scaler
        torch.save({"scaler": scaler.state_dict()}, self.path)

    def clip(self, optimizer, parameters):
        self.scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
