"""Mixed-precision training split into functions, with evaluation and a checkpoint.

main() builds the model, optimizer and GradScaler and hands them to
train_one_epoch(). The scaler state is saved and restored with the rest.
"""

import os
import tempfile

import roundpipe
import torch
import torch.nn as nn

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it

STEPS_PER_EPOCH = 4


def train_one_epoch(model, optimizer, scaler, batches, epoch):
    criterion = nn.MSELoss()
    device_type = next(model.parameters()).device.type
    model.train()
    for i, (inputs, targets) in enumerate(batches):
        global_step = epoch * len(batches) + i
        with torch.autocast(device_type=device_type, dtype=torch.bfloat16):

            def _loss_fn(output, targets):
                loss = criterion(output, targets)
                _losses.append(loss.detach().cpu() / NUM_MICROBATCH)
                return scaler.scale(loss) / NUM_MICROBATCH

            _losses = []
            model.forward_backward(input_args=(inputs,), label=targets, loss_fn=_loss_fn)
            loss = sum(_losses)

        # Backward on the scaled loss; the scaler unscales before stepping.
        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()

        print(f"step {global_step} loss {loss.item():.6f}")


def evaluate(model, batches):
    criterion = nn.MSELoss()
    model.synchronize()
    model.eval()
    total = 0.0
    with torch.no_grad():
        for inputs, targets in batches:
            total += criterion(model(inputs), targets).item()
    model.train()
    return total / len(batches)


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.Adam(model.optim_parameters(), lr=5e-3)
    scaler = roundpipe.GradScaler(enabled=device != "cuda" or torch.cuda.is_available())

    def make_batches(n):
        return [(torch.randn(16, 10).to(device), torch.randn(16, 2).to(device)) for _ in range(n)]

    train_batches = make_batches(STEPS_PER_EPOCH)
    val_batches = make_batches(2)

    for epoch in range(2):
        train_one_epoch(model, optimizer, scaler, train_batches, epoch)
        print(f"eval epoch {epoch} loss {evaluate(model, val_batches):.6f}")

    # Round-trip everything needed to resume training, the scaler included.
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        model.synchronize()
        torch.save(
            {"model": model.model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
            path,
        )
        print("saved")
        checkpoint = torch.load(path, map_location=device)
        model.model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        print("loaded")


if __name__ == "__main__":
    main()
