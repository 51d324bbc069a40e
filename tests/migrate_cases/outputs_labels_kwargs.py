import torch
import torch.nn.functional as F


def fit(model, batches, device):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.GradScaler(device)
    for step, (x, mask, y, w) in enumerate(batches):
        x, y = x.to(device), y.to(device)
        with torch.autocast(device_type=device):
            logits = model(x, attention_mask=mask)
            loss = F.cross_entropy(logits, y, reduction="sum") * w.mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        model.zero_grad(set_to_none=True)
        acc = (logits.argmax(-1) == y).float().mean().item()
        print(step, loss.item(), acc)
