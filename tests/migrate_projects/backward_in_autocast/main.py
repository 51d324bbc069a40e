"""Shape: beginner code with the backward inside the autocast block.

``optimizer.zero_grad()`` at the top of the iteration, then ``with torch.autocast(...)``
holding the forward, the loss and ``scaler.scale(loss).backward()``; ``scaler.step`` and
``scaler.update()`` after the block; the outputs are used after the step (accuracy). Hard:
the backward is nested in the ``with``, the step follows the compound statement.
"""

import torch
from torch import nn

torch.manual_seed(0)


def main():
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True)
    scaler = torch.amp.GradScaler("cpu")
    step = 0
    for epoch in range(2):
        for i in range(4):
            x = torch.randn(6, 8)
            y = torch.randint(0, 3, (6,))
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outputs = model(x)
                loss = criterion(outputs.float(), y)
                scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            _, predicted = outputs.max(1)
            acc = (predicted == y).float().mean().item()
            print(f"step {step} loss {loss.item()!r} acc {acc!r}")
            step += 1
    print("final scale", scaler.get_scale())


if __name__ == "__main__":
    main()
