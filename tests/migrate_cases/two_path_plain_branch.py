"""Two-path AMP: an optional scaler (None without AMP) guarded by `is not None`, the plain
branch with its own backward and step; both take RoundPipe's form."""

import torch


def train(model, loader, use_amp, clip):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda") if use_amp else None
    for x, y in loader:
        optimizer.zero_grad()
        with torch.autocast("cuda", enabled=use_amp):
            out = model(x)
        loss = torch.nn.functional.cross_entropy(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()  # AMP path
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()  # plain path
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
        print(f"loss {loss.item():.4f}")
