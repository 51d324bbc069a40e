"""Shape: MAE/DeiT's ``train_one_epoch`` with timm's ``NativeScaler`` and ``accum_iter``.

The scaler wrapper (``scaler.py``) runs the backward on every call and steps only when
``need_update=(it + 1) % accum_iter == 0``; the loop calls ``optimizer.zero_grad()`` before
it and under ``if (it + 1) % accum_iter == 0:`` after the wrapper call. An epoch of 5
batches with ``accum_iter=2`` leaves the last batch's gradient pending; the next epoch's
pre-loop ``zero_grad()`` drops it. Hard: both ``zero_grad()`` calls stay on the main
thread, in another file than the step, and must clear the model's gradients too.
"""

import torch
import torch.nn as nn

from scaler import NativeScaler


def train_one_epoch(model, batches, optimizer, loss_scaler, accum_iter, epoch):
    model.train()
    optimizer.zero_grad()
    for it, (x, y) in enumerate(batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        loss_value = loss.item()
        loss = loss / accum_iter
        loss_scaler(loss, optimizer, parameters=model.parameters(), need_update=(it + 1) % accum_iter == 0)
        if (it + 1) % accum_iter == 0:
            optimizer.zero_grad()
        print(f"step {epoch * len(batches) + it} loss {loss_value!r}")


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_scaler = NativeScaler()
    gen = torch.Generator().manual_seed(6)
    batches = [(torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen)) for _ in range(5)]
    for epoch in range(3):
        train_one_epoch(model, batches, optimizer, loss_scaler, accum_iter=2, epoch=epoch)
    print(f"final scale {loss_scaler.state_dict()['scale']!r}")


if __name__ == "__main__":
    main()
