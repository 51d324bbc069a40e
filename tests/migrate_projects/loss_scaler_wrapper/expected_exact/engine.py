"""One epoch of training, written against the loss scaler's call interface (migrated by
hand: the grads and norms are the optimizer copies')."""

import torch
import torch.nn.functional as F


def train_one_epoch(model, loader, optimizer, loss_scaler, epoch, accum_iter=2, clip_grad=None, start_step=0):
    model.train()
    optimizer.zero_grad()
    step = start_step
    for data_iter_step, (samples, targets) in enumerate(loader):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = model(samples)
            loss = F.cross_entropy(outputs, targets)
        loss_value = loss.item()
        loss = loss / accum_iter
        update = (data_iter_step + 1) % accum_iter == 0
        norm = loss_scaler(loss, optimizer, clip_grad=clip_grad, parameters=model.optim_parameters(), update_grad=update)
        if update:
            optimizer.zero_grad()
            step += 1
            print(f"step {step} loss {loss_value!r} grad_norm {norm.item()!r}")
    return step
