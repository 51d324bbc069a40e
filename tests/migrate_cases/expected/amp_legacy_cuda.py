"""Older torch.cuda.amp spellings, as found in many pre-2.x training scripts.

AMP is only switched on when CUDA is present; on a CPU-only machine the scaler
and autocast are disabled and the loop runs in full precision.
"""

import roundpipe
import torch
import torch.nn as nn
from torch.cuda import amp

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    use_amp = torch.cuda.is_available()
    device = torch.device("cuda" if use_amp else "cpu")

    model = nn.Sequential(
        nn.Conv2d(1, 4, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(16, 3),
    ).to(device)
    criterion = nn.CrossEntropyLoss()
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.Adam(model.optim_parameters(), lr=1e-2)

    # Positional first argument is init_scale.
    scaler = roundpipe.GradScaler(1024.0, enabled=use_amp and torch.cuda.is_available())

    images = torch.randn(8, 6, 1, 8, 8)
    labels = torch.randint(0, 3, (8, 6))

    for step in range(8):
        inputs = images[step].to(device)
        targets = labels[step].to(device)
        # Autocast region: the forward pass and the loss.
        with amp.autocast(enabled=use_amp):

            def _loss_fn(output, targets):
                loss = criterion(output, targets)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
            loss = sum(_losses)

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
