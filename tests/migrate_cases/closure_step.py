import torch


def train(model, data):
    optimizer = torch.optim.LBFGS(model.parameters())
    scaler = torch.amp.GradScaler("cuda")
    for x, y in data:
        loss = (model(x) - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer, lambda: loss)
        scaler.update()
