"""Canonical mixed-precision training loop: autocast forward, scaled backward.

A small MLP learns a synthetic regression target. The GradScaler multiplies the
loss before backward and unscales the gradients inside scaler.step().
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def make_batches(num_batches, batch_size, in_features, device):
    batches = []
    for _ in range(num_batches):
        x = torch.randn(batch_size, in_features)
        y = x.sum(dim=1, keepdim=True) * 0.5 + 0.1 * torch.randn(batch_size, 1)
        batches.append((x.to(device), y.to(device)))
    return batches


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(
        nn.Linear(16, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 1),
    ).to(device)
    criterion = nn.MSELoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=3e-3, weight_decay=0.01)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())

    batches = make_batches(num_batches=8, batch_size=32, in_features=16, device=device)

    model.train()
    for step, (x, y) in enumerate(batches):
        # Forward pass and loss run in reduced precision.
        with torch.autocast(device_type=device, dtype=torch.bfloat16):

            def _loss_fn(output, y):
                loss = criterion(output, y)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)
            loss = sum(_losses)

        # Scale the loss so small gradients do not underflow.
        # step() unscales the gradients and skips the update on inf/nan.
        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        model.step(_step_fn)
        scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
