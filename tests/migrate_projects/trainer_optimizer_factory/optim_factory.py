"""The project's optimizer factory, in its own module: decay/no-decay groups by name, a
lower learning rate for the head, the optimizer class chosen by a string."""

import torch


def param_groups(model, weight_decay, head_lr_scale):
    groups = {"decay": [], "no_decay": [], "head": []}
    for name, param in model.named_parameters():
        if name.startswith("2."):
            groups["head"].append(param)
        elif name.endswith("bias") or param.ndim == 1:
            groups["no_decay"].append(param)
        else:
            groups["decay"].append(param)
    return [
        {"params": groups["decay"], "weight_decay": weight_decay},
        {"params": groups["no_decay"], "weight_decay": 0.0},
        {"params": groups["head"], "weight_decay": weight_decay, "lr_scale": head_lr_scale},
    ]


def build_optimizer(cfg, model):
    groups = param_groups(model, cfg["weight_decay"], cfg["head_lr_scale"])
    name = cfg["optimizer"].lower()
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=cfg["lr"], betas=(0.9, 0.95))
    elif name == "sgd":
        return torch.optim.SGD(groups, lr=cfg["lr"], momentum=0.9, nesterov=True)
    raise ValueError(f"unknown optimizer {name!r}")
