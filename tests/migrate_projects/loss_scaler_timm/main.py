"""Shape: an optional loss-scaler wrapper, timm's way (issue 10, shapes 2 and 4).

``scaler.py`` defines ``NativeScaler`` (scale/backward, then on ``need_update`` unscale,
clip by norm or value, step, update; returns nothing). ``main.py`` builds it only when AMP is
on (``loss_scaler = NativeScaler() if use_amp else None``) and ``train_one_epoch`` takes the
two paths: ``loss_scaler(...)`` or ``loss.backward(); optimizer.step()``, with a
``second_order`` flag feeding ``create_graph`` and clipping by value. Hard: the wrapper is
optional, so the migration must keep the plain path and the wrapper path consistent.
"""

import argparse
from contextlib import suppress
from functools import partial

import torch
import torch.nn as nn

from scaler import NativeScaler, dispatch_clip_grad


def train_one_epoch(model, batches, optimizer, loss_fn, amp_autocast=suppress, loss_scaler=None, clip_grad=None, clip_mode="norm"):
    second_order = hasattr(optimizer, "is_second_order") and optimizer.is_second_order
    model.train()
    for batch_idx, (inputs, target) in enumerate(batches):
        with amp_autocast():
            output = model(inputs)
            loss = loss_fn(output, target)
        optimizer.zero_grad()
        if loss_scaler is not None:
            loss_scaler(
                loss, optimizer,
                clip_grad=clip_grad, clip_mode=clip_mode,
                parameters=model.parameters(),
                create_graph=second_order,
            )
        else:
            loss.backward(create_graph=second_order)
            if clip_grad is not None:
                dispatch_clip_grad(model.parameters(), value=clip_grad, mode=clip_mode)
            optimizer.step()
        print(f"step {batch_idx} loss {loss.item()!r}")


def main():
    parser = argparse.ArgumentParser(description="timm-style training")
    parser.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True)
    use_amp = parser.parse_args().amp
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 32), nn.Hardswish(), nn.Linear(32, 4))
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3, momentum=0.9)
    amp_autocast = suppress
    loss_scaler = None
    if use_amp:
        amp_autocast = partial(torch.autocast, device_type="cpu", dtype=torch.bfloat16)
        loss_scaler = NativeScaler()
    gen = torch.Generator().manual_seed(6)
    batches = [(torch.randn(8, 4, 4, generator=gen), torch.randint(0, 4, (8,), generator=gen)) for _ in range(8)]
    train_one_epoch(
        model, batches, optimizer, nn.CrossEntropyLoss(label_smoothing=0.1),
        amp_autocast=amp_autocast, loss_scaler=loss_scaler, clip_grad=0.05, clip_mode="value",
    )
    print(f"final scale {loss_scaler.state_dict()['scale'] if loss_scaler else None!r}")


if __name__ == "__main__":
    main()
