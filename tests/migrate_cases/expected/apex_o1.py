"""Mixed-precision regression with NVIDIA apex amp at opt level O1.

O1 keeps the model weights in fp32 and patches torch functions so that
matmul-heavy ops run in fp16. The loss is scaled dynamically inside
amp.scale_loss and the gradients are unscaled when the block exits.
Requires a CUDA machine with apex <= 25.05 (apex.amp was removed later).
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


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

    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1")

    batches = make_batches(num_batches=8, batch_size=32, in_features=12, device=device)

    model.train()
    amp_scaler = roundpipe.compat.loss_scaler()
    for step, (inputs, targets) in enumerate(batches):
        # Clear the gradients left over from the previous iteration.

        def _loss_fn(output, targets):
            loss = criterion(output, targets)
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
        loss = sum(_losses)

        # Backward on the scaled loss; amp unscales the grads on exit.
        # If the grads overflowed, amp turns this step into a no-op.
        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
