"""Helpers of the detector trainer: the optimizer built group by group, the loss object."""

import torch
import torch.nn as nn


def smart_optimizer(model, lr=0.01, momentum=0.9, decay=1e-5):
    """Three groups: weights with decay, norm weights without, biases without; the first
    group builds the optimizer, the other two are added to it."""
    g = [], [], []
    bn = tuple(v for k, v in nn.__dict__.items() if "Norm" in k)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if name == "bias":
                g[2].append(p)
            elif name == "weight" and isinstance(module, bn):
                g[1].append(p)
            else:
                g[0].append(p)
    optimizer = torch.optim.SGD(g[2], lr=lr, momentum=momentum, nesterov=True)
    optimizer.add_param_group({"params": g[0], "weight_decay": decay})
    optimizer.add_param_group({"params": g[1], "weight_decay": 0.0})
    return optimizer


class ComputeLoss:
    """A box and an objectness term; returns the total times the batch size and the parts."""

    def __init__(self, box_gain=0.05, obj_gain=1.0):
        self.box_gain, self.obj_gain = box_gain, obj_gain
        self.bce = nn.BCEWithLogitsLoss()

    def __call__(self, pred, targets):
        lbox = (pred[:, :4] - targets[:, :4]).abs().mean() * self.box_gain
        lobj = self.bce(pred[:, 4], targets[:, 4]) * self.obj_gain
        bs = pred.shape[0]
        return (lbox + lobj) * bs, torch.cat((lbox.reshape(1), lobj.reshape(1))).detach()
