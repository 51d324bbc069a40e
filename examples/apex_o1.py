"""Mixed-precision regression with NVIDIA apex amp at opt level O1.

O1 keeps the model weights in fp32 and patches torch functions so that
matmul-heavy ops run in fp16. The loss is scaled dynamically inside
amp.scale_loss and the gradients are unscaled when the block exits.
Requires a CUDA machine with apex <= 25.05 (apex.amp was removed later).
"""

import torch
import torch.nn as nn
from apex import amp


def make_batches(num_batches, batch_size, in_features, device):
    batches = []
    for _ in range(num_batches):
        x = torch.randn(batch_size, in_features)
        y = (x[:, :4].sum(dim=1, keepdim=True) - x[:, 4:8].mean(dim=1, keepdim=True)) * 0.3
        batches.append((x.to(device), y.to(device)))
    return batches


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # Build the model in fp32; amp decides what runs in half precision.
    model = nn.Sequential(
        nn.Linear(12, 48),
        nn.Tanh(),
        nn.Linear(48, 24),
        nn.Tanh(),
        nn.Linear(24, 1),
    ).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")

    batches = make_batches(num_batches=8, batch_size=32, in_features=12, device=device)

    model.train()
    for step, (inputs, targets) in enumerate(batches):
        # Clear the gradients left over from the previous iteration.
        optimizer.zero_grad()

        output = model(inputs)
        loss = criterion(output, targets)

        # Backward on the scaled loss; amp unscales the grads on exit.
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        # If the grads overflowed, amp turns this step into a no-op.
        optimizer.step()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
