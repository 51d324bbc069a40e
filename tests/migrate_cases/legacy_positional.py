import torch
from torch.cuda import amp


def train(model, data, lr):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    scaler = amp.GradScaler(2.0 ** 10, 3.0, enabled=torch.cuda.is_available())  # legacy spelling
    for x, y in data:
        with amp.autocast(torch.cuda.is_available()):
            pred = model(x)
            loss = ((pred - y) ** 2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
