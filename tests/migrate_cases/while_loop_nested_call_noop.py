import torch
import torch.nn.functional as F


def train(model, loader, max_steps, scaler):
    # `scaler` here is a plain number used to weight the loss, not a GradScaler.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    step = 0
    it = iter(loader)
    while step < max_steps:
        batch = next(it)
        loss = F.mse_loss(model(batch["x"]), batch["y"]) * scaler
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        step += 1
