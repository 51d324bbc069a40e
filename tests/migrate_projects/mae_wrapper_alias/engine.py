"""One epoch of accumulated steps through the wrapper, and the evaluation."""

import torch
import torch.nn.functional as F

import util.lr_sched as lr_sched


def train_one_epoch(model, batches, optimizer, epoch, loss_scaler, args):
    model.train(True)
    optimizer.zero_grad()
    for step, (samples, targets) in enumerate(batches):
        if step % args.accum_iter == 0:
            lr_sched.adjust_learning_rate(optimizer, step / len(batches) + epoch, args)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(samples), targets)
        loss_value = loss.item()
        loss = loss / args.accum_iter
        update = (step + 1) % args.accum_iter == 0
        grad_norm = loss_scaler(loss, optimizer, parameters=model.parameters(), update_grad=update)
        if update:
            optimizer.zero_grad()
        norm = None if grad_norm is None else grad_norm.item()
        print(f"step {epoch * len(batches) + step} loss {loss_value!r} norm {norm!r}")


@torch.no_grad()
def evaluate(batches, model):
    model.eval()
    return sum(F.cross_entropy(model(x), y).item() for x, y in batches)
