"""Optimizer construction from parameter groups (timm/BEiT style)."""

import torch


def param_groups_weight_decay(model, weight_decay=1e-5, no_weight_decay_list=()):
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        if param.ndim <= 1 or name.endswith(".bias") or name in no_weight_decay_list:
            no_decay.append(param)
        else:
            decay.append(param)
    return [
        {"params": no_decay, "weight_decay": 0.0},
        {"params": decay, "weight_decay": weight_decay},
    ]


def param_groups_layer_decay(model, weight_decay=0.05, layer_decay=0.75):
    num_layers = len(model.blocks) + 1
    scales = [layer_decay ** (num_layers - i) for i in range(num_layers + 1)]
    groups = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        no_decay = param.ndim == 1
        layer_id = int(name.split(".")[1]) + 1 if name.startswith("blocks.") else (0 if name.startswith("embed") else num_layers)
        key = f"layer_{layer_id}_{'no_decay' if no_decay else 'decay'}"
        if key not in groups:
            groups[key] = {"params": [], "weight_decay": 0.0 if no_decay else weight_decay, "lr_scale": scales[layer_id]}
        groups[key]["params"].append(param)
    return list(groups.values())


def create_optimizer(model, lr, weight_decay, layer_decay=None):
    if layer_decay is not None:
        groups = param_groups_layer_decay(model, weight_decay, layer_decay)
    else:
        groups = param_groups_weight_decay(model, weight_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)
