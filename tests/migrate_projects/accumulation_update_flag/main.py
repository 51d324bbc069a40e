"""Shape: gradient accumulation through an ``update_grad``-style flag (issue 10, shape 6).

Every iteration scales and backpropagates ``loss / accum_iter``; a flag computed from the
iteration index (``(it + 1) % accum_iter == 0``, or the last batch of the epoch) decides
whether unscale/clip/step/update/zero_grad run; the logged loss is the undivided one.
An epoch of 7 batches with ``accum_iter=3`` ends with a short accumulation. Hard: the step
and the update sit under a condition that is not a plain modulo.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    torch.manual_seed(0)
    dataset = TensorDataset(torch.randn(56, 6), torch.randn(56, 2))
    loader = DataLoader(dataset, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(16))
    model = nn.Sequential(nn.Linear(6, 24), nn.Mish(), nn.Linear(24, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.02)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**11, growth_interval=2)
    accum_iter = 3
    updates = 0
    for epoch in range(2):
        for it, (x, y) in enumerate(loader):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.huber_loss(model(x).float(), y, delta=0.5)
            loss_value = loss.item()
            scaler.scale(loss / accum_iter).backward()
            update_grad = (it + 1) % accum_iter == 0 or it + 1 == len(loader)
            if update_grad:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
                updates += 1
            print(f"step {epoch * len(loader) + it} loss {loss_value!r} updated {update_grad}")
    print(f"final scale {scaler.get_scale()!r} after {updates} updates")


if __name__ == "__main__":
    main()
