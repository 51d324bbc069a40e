"""Shape: an AMP helper class with separate methods (issue 10, shape 2).

``amp.AMPScaler`` owns the GradScaler (built inline, or handed in as ``scaler=``) behind
``scale_loss``/``backward``, ``unscale``, ``optimizer_step`` (step and update) and the
scaler's state methods, the Swin/detectron2-utility shape. The loop calls
``amp.scale_loss(loss).backward()`` on even steps and ``amp.backward(loss)`` on odd ones,
clips between ``amp.unscale(optimizer)`` and ``amp.optimizer_step(optimizer)``, and
checkpoints the helper's state. Hard: no scaler call appears in the loop, and the clipping
sits in the caller between two helper calls.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from amp import AMPScaler


def train_one_epoch(model, loader, optimizer, amp, clip_grad):
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        if step % 2 == 0:
            amp.scale_loss(loss).backward()
        else:
            amp.backward(loss)
        amp.unscale(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        amp.optimizer_step(optimizer)
        print(f"step {step} loss {loss.item()!r} norm {norm.item()!r}")


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
