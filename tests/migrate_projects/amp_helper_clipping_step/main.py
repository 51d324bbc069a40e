"""Shape: an AMP helper whose step method clips (issue 10, shape 2).

``GradScalerWrapper`` has ``scale(loss)`` (the caller backpropagates what it returns) and
``step(optimizer, clip_grad=None, parameters=None)``, which unscales and clips when asked,
then steps and updates; the loop clips on odd steps only and hands ``model.parameters()``.
Hard: the clipping happens inside the helper, on parameters the caller hands in.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GradScalerWrapper:
    def __init__(self, enabled=True, scaler=None):
        self.scaler = scaler or torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2, enabled=enabled)

    def scale(self, loss):
        return self.scaler.scale(loss)

    def step(self, optimizer, clip_grad=None, parameters=None):
        """Unscale and clip when asked, then step and update."""
        if clip_grad is not None:
            assert parameters is not None
            self.scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(parameters, clip_grad)
        self.scaler.step(optimizer)
        self.scaler.update()

    def state_dict(self):
        return self.scaler.state_dict()


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    wrapper = GradScalerWrapper()
    for step in range(6):
        x, y = torch.randn(12, 8, generator=gen), torch.randint(0, 2, (12,), generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        wrapper.scale(loss).backward()
        wrapper.step(optimizer, clip_grad=0.1 if step % 2 else None, parameters=model.parameters())
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {wrapper.state_dict()['scale']!r}")


if __name__ == "__main__":
    main()
