"""Autograd form: a value computed in the forward is read in the next iteration.

`aux` is computed between the forward and the loss and printed at the top of the next
iteration. Moving it into a loss function would leave the printed `aux` stale (or
unbound), so the forward and the loss stay as written and only the optimizer work moves
into the step function.
"""

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, optimizer, batches):
    scaler = roundpipe.GradScaler(enabled=torch.cuda.is_available())
    for step, (x, y) in enumerate(batches):
        if step:
            print(f"previous aux {aux.item():.4f}")
        with torch.autocast("cuda"):
            out = model(x)
            aux = out.pow(2).mean()
            loss = torch.nn.functional.mse_loss(out, y) + 0.01 * aux
        scaler.scale(loss).backward()

        def _step_fn():
            scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        scaler.update()


def main():
    model = torch.nn.Linear(4, 1)
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    train(model, optimizer, [])
