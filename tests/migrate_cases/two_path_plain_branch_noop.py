"""No-op twin of two_path_plain_branch: already migrated, an optional RoundPipe scaler (it
mentions GradScaler, so it gets past the prefilter) is left alone."""

import roundpipe
import torch


def train(model, loader, use_amp):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.SGD(model.optim_parameters(), lr=0.1)
    scaler = roundpipe.GradScaler("cuda") if use_amp else None
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            model.step(lambda: scaler.step(optimizer))
            scaler.update()
        else:
            loss.backward()
            model.step(optimizer.step)
