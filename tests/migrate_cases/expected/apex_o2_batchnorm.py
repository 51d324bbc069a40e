"""A BatchNorm classifier trained with apex amp O2 and fp32 master weights.

O2 casts the model to fp16 except for the BatchNorm layers (kept in fp32 by
keep_batchnorm_fp32=True) and lets the optimizer update fp32 master copies.
Gradients are clipped on amp.master_params(optimizer), the fp32 masters,
after they have been unscaled. Needs CUDA and apex <= 25.05.
"""

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(
        nn.Linear(20, 64),
        nn.BatchNorm1d(64),
        nn.ReLU(),
        nn.Linear(64, 32),
        nn.BatchNorm1d(32),
        nn.ReLU(),
        nn.Linear(32, 4),
    ).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)

    model, optimizer = roundpipe.compat.initialize(
        model,
        optimizer,
        opt_level="O2",
        keep_batchnorm_fp32=True,
        loss_scale="dynamic",
    )

    # Four classes separated by the sign pattern of two input features.
    batches = []
    for _ in range(10):
        x = torch.randn(48, 20)
        y = (x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long()
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

        # The scaled backward fills the fp16 grads; amp copies them to the
        # fp32 master grads and unscales those when the block exits.
        # Clip the (already unscaled) fp32 master gradients.
        def _step_fn():
            amp_scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(roundpipe.compat.master_params(optimizer), 1.0)
            amp_scaler.step(optimizer)
            scheduler.step()
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()

        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
