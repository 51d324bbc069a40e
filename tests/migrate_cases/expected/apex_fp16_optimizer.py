"""The oldest apex mixed-precision API: FP16_Optimizer around a model made half by hand.

Before amp.initialize existed, users converted the model with .half(), fed half inputs,
and wrapped the optimizer in FP16_Optimizer, which keeps fp32 master weights and scales
the loss inside optimizer.backward(loss). apex's transition guide maps this to O2.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    # The old API needed the model in half precision up front.
    model = nn.Sequential(nn.Linear(12, 24), nn.Tanh(), nn.Linear(24, 1)).to(device).half()
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer = roundpipe.compat.initialize(model.float(), optimizer, opt_level="O2", loss_scale="dynamic")

    weights = torch.randn(12, 1)
    batches = []
    for _ in range(8):
        x = torch.randn(16, 12)
        batches.append((x.to(device).half(), (x @ weights).to(device)))
    amp_scaler = roundpipe.compat.loss_scaler()

    for step, (inputs, targets) in enumerate(batches):

        def _loss_fn(output, targets):
            loss = criterion(output.float(), targets)  # the loss itself in fp32
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
        loss = sum(_losses)

        # FP16_Optimizer scales the loss, back-propagates and copies grads to the masters.
        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
