"""Shape: a step split over helpers whose scaler parameters differ in name (issue 10, shape 3).

``steps.py`` holds ``backward_step(loss, amp_scaler)`` and ``optimizer_step(optimizer,
grad_scaler, model)``; the loop hands both the one scaler it built. Hard: nothing but the
caller says that ``amp_scaler`` and ``grad_scaler`` are the same object.
"""

import torch
import torch.nn as nn

from steps import backward_step, optimizer_step


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.SiLU(), nn.Linear(12, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0, growth_interval=2)
    gen = torch.Generator().manual_seed(3)
    for step in range(6):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = nn.functional.mse_loss(model(x).float(), y)
        backward_step(loss, scaler)
        optimizer_step(optimizer, scaler, model)
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
