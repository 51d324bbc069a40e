"""Two loss terms on one output, registered with apex amp via num_losses.

The model predicts a value that is judged by both an MSE and an L1 term.
amp.initialize is told to expect two losses; the summed loss is backpropagated
through loss_id=0 in one amp.scale_loss block. Needs CUDA and apex <= 25.05.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(
        nn.Linear(8, 40),
        nn.GELU(),
        nn.Linear(40, 2),
    ).to(device)
    mse = nn.MSELoss()
    l1 = nn.L1Loss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.8)

    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1", num_losses=2)

    # Target: two linear read-outs of the inputs with a little noise.
    projection = torch.randn(8, 2) * 0.5
    batches = []
    for _ in range(7):
        x = torch.randn(32, 8)
        y = x @ projection + 0.05 * torch.randn(32, 2)
        batches.append((x.to(device), y.to(device)))

    model.train()
    amp_scaler = roundpipe.compat.loss_scaler()
    for step, (inputs, targets) in enumerate(batches):

        def _loss_fn(output, targets):
            # Both criteria look at the same prediction.
            loss_a = mse(output, targets)
            loss_b = 0.5 * l1(output, targets)
            loss = loss_a + loss_b
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
        loss = sum(_losses)

        # loss_id picks which of the num_losses scalers handles this backward.
        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
