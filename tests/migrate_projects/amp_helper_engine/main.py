"""Shape: an AMP helper class with separate methods, over three files (issue 10, shape 2).

``amp.py`` defines the helper, ``main.py`` builds it with a GradScaler handed in and
checkpoints its state, ``engine.py`` trains through it without ever seeing the class: the
calls ``amp.scale_loss(loss).backward()``/``amp.backward(loss)``, ``amp.unscale(optimizer)``,
clipping and ``amp.optimizer_step(optimizer)`` are in a file that imports nothing of it.
Hard: the helper's method roles have to travel from the class's file to the loop's.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp import AMPScaler
from engine import train_one_epoch


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    loader = [(torch.randn(16, 10, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(6)]
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    amp = AMPScaler(scaler=torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=2))
    train_one_epoch(model, loader, optimizer, amp, clip_grad=0.25)
    state = {"model": model.state_dict(), "amp": amp.state_dict()}
    print(f"final scale {state['amp']['scale']!r} {amp.get_scale()!r}")


if __name__ == "__main__":
    main()
