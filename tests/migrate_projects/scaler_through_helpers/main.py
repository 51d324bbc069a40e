"""Shape: the scaler passed through helpers across modules (issue 10, shape 3).

``amp_setup.setup_amp`` returns the scaler (with an autocast factory); the loop passes it
to ``steps.backward_step`` and ``steps.optimizer_step``, which name it ``grad_scaler``, so the
backward and the step happen in two functions of another module. Hard: no line of the loop
touches the scaler directly.
"""

import torch
import torch.nn as nn

from amp_setup import setup_amp
from steps import backward_step, optimizer_step

CFG = {"init_scale": 128.0, "growth_interval": 2, "lr": 0.03, "max_norm": 2.0, "steps": 8}


def main():
    torch.manual_seed(0)
    autocast, scaler = setup_amp(CFG)
    model = nn.Sequential(nn.Linear(5, 10), nn.Tanh(), nn.Linear(10, 1))
    optimizer = torch.optim.Adagrad(model.parameters(), lr=CFG["lr"])
    gen = torch.Generator().manual_seed(8)
    for step in range(CFG["steps"]):
        x = torch.randn(12, 5, generator=gen)
        y = (x[:, :1] > 0).float()
        with autocast():
            logits = model(x)
            loss = nn.functional.binary_cross_entropy_with_logits(logits.float(), y)
        backward_step(loss, scaler)
        optimizer_step(optimizer, scaler, model, max_norm=CFG["max_norm"])
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
