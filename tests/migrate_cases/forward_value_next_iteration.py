"""Autograd form: a value computed in the forward is read in the next iteration.

`aux` is computed between the forward and the loss and printed at the top of the next
iteration. Moving it into a loss function would leave the printed `aux` stale (or
unbound), so the forward and the loss stay as written and only the optimizer work moves
into the step function.
"""

import torch


def train(model, optimizer, batches):
    scaler = torch.amp.GradScaler("cuda")
    for step, (x, y) in enumerate(batches):
        if step:
            print(f"previous aux {aux.item():.4f}")
        with torch.autocast("cuda"):
            out = model(x)
            aux = out.pow(2).mean()
            loss = torch.nn.functional.mse_loss(out, y) + 0.01 * aux
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()


def main():
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    train(model, optimizer, [])
