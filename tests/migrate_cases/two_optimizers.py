import torch


def train(model, head, data):
    opt_a = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_b = torch.optim.SGD(head.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in data:
        loss = (head(model(x)) - y).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt_a)
        scaler.step(opt_b)
        scaler.update()
