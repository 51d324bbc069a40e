import torch


def train_step(model, optimizer, scaler, x, y):
    loss = (model(x) - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()


scaler = torch.amp.GradScaler("cuda")
