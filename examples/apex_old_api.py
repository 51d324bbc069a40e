"""Training with the original apex amp API: amp.init() and an AmpHandle.

Before amp.initialize existed, users called amp.init() once to patch torch
functions (what opt_level O1 does today) and backpropagated through
amp_handle.scale_loss. The model stays in fp32 and the loss scale is always
dynamic. Only early apex releases implement this API; the transition guide
replaces it with amp.initialize(..., opt_level="O1") and amp.scale_loss.
"""

import torch
import torch.nn as nn
from apex import amp


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # Old-style amp: patch torch once, keep the handle for loss scaling.
    amp_handle = amp.init(enabled=True)

    model = nn.Sequential(
        nn.Linear(6, 32),
        nn.ReLU(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 1),
    ).to(device)
    criterion = nn.SmoothL1Loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    batches = []
    for _ in range(8):
        x = torch.randn(16, 6)
        y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]
        batches.append((x.to(device), y.to(device)))

    model.train()
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad()

        output = model(inputs)
        loss = criterion(output, targets)

        # The handle scales the loss and unscales the grads on exit.
        with amp_handle.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
