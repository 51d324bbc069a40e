"""Diagnostic RPM115: the model trained by a GradScaler loop is also trained by a plain
fp32 loop (a warm-up phase). Wrapping it would leave the warm-up training outside
RoundPipe's step, so the file is left unchanged."""

import torch


def main(loader, warmup_loader):
    model = torch.nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for x, y in warmup_loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for x, y in loader:
        with torch.autocast("cuda"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
