import torch
import torch.nn.functional as F


def train(model, batches, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler(device)
    for x, y in batches:
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            logits = model(x)
        # the loss in full precision, outside autocast
        loss = F.cross_entropy(logits.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
