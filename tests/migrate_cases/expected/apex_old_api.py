"""Training with the original apex amp API: amp.init() and an AmpHandle.

Before amp.initialize existed, users called amp.init() once to patch torch
functions (what opt_level O1 does today) and backpropagated through
amp_handle.scale_loss. The model stays in fp32 and the loss scale is always
dynamic. Only early apex releases implement this API; the transition guide
replaces it with amp.initialize(..., opt_level="O1") and amp.scale_loss.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # Old-style amp: patch torch once, keep the handle for loss scaling.

    model = nn.Sequential(
        nn.Linear(6, 32),
        nn.ReLU(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 1),
    ).to(device)
    criterion = nn.SmoothL1Loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1", enabled=True)

    batches = []
    for _ in range(8):
        x = torch.randn(16, 6)
        y = torch.sin(x[:, :1]) + 0.5 * x[:, 1:2]
        batches.append((x.to(device), y.to(device)))

    model.train()
    amp_scaler = roundpipe.compat.loss_scaler()
    for step, (inputs, targets) in enumerate(batches):

        def _loss_fn(output, targets):
            loss = criterion(output, targets)
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
        loss = sum(_losses)

        # The handle scales the loss and unscales the grads on exit.
        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
