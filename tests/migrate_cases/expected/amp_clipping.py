"""Gradient clipping with a GradScaler: unscale first, then clip, then step.

A small init_scale and growth_interval make the loss scale grow during the
run, so the logged scale changes.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(
        nn.Linear(12, 32),
        nn.Tanh(),
        nn.Linear(32, 1),
    ).to(device)
    criterion = nn.MSELoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.05, momentum=0.9)
    scaler = roundpipe.GradScaler(
        init_scale=2.0**8,
        growth_interval=3,
        enabled=device != "cuda" or torch.cuda.is_available(),
    )

    weights = torch.randn(12, 1)
    for step in range(10):
        inputs = torch.randn(24, 12)
        targets = inputs @ weights + 0.05 * torch.randn(24, 1)
        inputs, targets = inputs.to(device), targets.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):

            def _loss_fn(output, targets):
                loss = criterion(output, targets)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
            loss = sum(_losses)

        # Gradients must be unscaled before clipping so max_norm means what it says.
        def _step_fn():
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.optim_parameters(), max_norm=1.0)

            # step() knows the gradients are already unscaled and will not do it twice.
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()

        print(f"step {step} loss {loss.item():.6f} scale {scaler.get_scale()}")


if __name__ == "__main__":
    main()
