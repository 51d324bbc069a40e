"""Command-line apex amp settings plus a checkpoint that includes amp state.

The opt level, keep_batchnorm_fp32 and loss scale come from argparse as
strings and go straight into amp.initialize, as in apex's ImageNet example.
After a few steps model, optimizer and loss-scaler state are saved, loaded
back and training resumes. Needs CUDA and NVIDIA apex <= 25.05.
"""

import argparse
import os
import tempfile

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, optimizer, criterion, batches, start_step):
    step = start_step
    amp_scaler = roundpipe.compat.loss_scaler()
    for inputs, targets in batches:

        def _loss_fn(output, targets):
            loss = criterion(output, targets)
            _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        _losses = []
        model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
        loss = sum(_losses)

        # amp multiplies the loss by the current scale before backward.
        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
        print(f"step {step} loss {loss.item():.6f}")
        step += 1
    return step


def main():
    parser = argparse.ArgumentParser(description="apex amp checkpoint example")
    parser.add_argument("--opt-level", type=str, default="O1")
    parser.add_argument("--keep-batchnorm-fp32", type=str, default=None)
    parser.add_argument("--loss-scale", type=str, default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.9)

    model, optimizer = roundpipe.compat.initialize(
        model,
        optimizer,
        opt_level=args.opt_level,
        keep_batchnorm_fp32=args.keep_batchnorm_fp32,
        loss_scale=args.loss_scale,
    )

    weight = torch.linspace(-1.0, 1.0, 10).unsqueeze(1)
    batches = []
    for _ in range(9):
        x = torch.randn(24, 10)
        batches.append((x.to(device), (x @ weight).to(device)))

    model.train()
    next_step = train(model, optimizer, criterion, batches[:6], start_step=0)

    with tempfile.TemporaryDirectory() as tmpdir:
        path = os.path.join(tmpdir, "checkpoint.pt")
        model.synchronize()
        torch.save(
            {
                "model": model.model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "amp": roundpipe.compat.state_dict(),
            },
            path,
        )
        print("saved")

        # Restore in the documented order: model, optimizer, then amp.
        checkpoint = torch.load(path)
        model.model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        roundpipe.compat.load_state_dict(checkpoint["amp"])
        print("loaded")

    train(model, optimizer, criterion, batches[6:], start_step=next_step)


if __name__ == "__main__":
    main()
