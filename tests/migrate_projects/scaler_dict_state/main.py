"""Shape: the scaler in a dict-like state and under other names (issue 10, shape 3).

The objects live in a ``state`` dict (``state["scaler"].scale(loss).backward()``), the loop
aliases the scaler as ``amp_scaler``, and a ``Namespace`` of objects is passed to the
evaluation/saving helper. Hard: subscripts and aliases, not plain names, carry the scaler.
"""

from types import SimpleNamespace

import torch
import torch.nn as nn


def build(lr):
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    return {
        "model": model,
        "optim": torch.optim.SGD(model.parameters(), lr=lr, momentum=0.8, dampening=0.1),
        "scaler": torch.amp.GradScaler("cpu", init_scale=32.0, growth_interval=2),
        "step": 0,
    }


def save(objs):
    return {"model": objs.model.state_dict(), "grad_scaler": objs.scaler.state_dict()}


def main():
    torch.manual_seed(0)
    state = build(lr=0.02)
    amp_scaler = state["scaler"]
    gen = torch.Generator().manual_seed(12)
    for _ in range(8):
        x = torch.randn(24, 4, generator=gen)
        y = torch.sin(x).sum(dim=1, keepdim=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = (state["model"](x).float() - y).pow(2).mean()
        state["scaler"].scale(loss).backward()
        amp_scaler.step(state["optim"])
        amp_scaler.update()
        state["optim"].zero_grad()
        state["step"] += 1
        print(f"step {state['step']} loss {loss.item()!r}")
    snapshot = save(SimpleNamespace(model=state["model"], scaler=amp_scaler))
    print(f"final scale {snapshot['grad_scaler']['scale']!r}")


if __name__ == "__main__":
    main()
