import torch
import torch.nn.functional as F


def train(model, loader, max_steps):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", growth_interval=100)
    step = 0
    it = iter(loader)
    while step < max_steps:
        batch = next(it)
        x, y = batch["x"], batch["y"]
        loss = F.mse_loss(model(x), y)  # forward inside the loss call
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        if step % 10 == 0:
            print(step, loss.item(), scaler.get_scale())
        step += 1
