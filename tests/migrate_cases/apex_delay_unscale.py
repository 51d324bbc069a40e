import torch
from apex import amp


def train(model, optimizer, batches, accum):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for i, (x, y) in enumerate(batches):
        loss = (model(x) - y).pow(2).mean()
        with amp.scale_loss(loss, optimizer, delay_unscale=(i + 1) % accum != 0) as scaled_loss:
            scaled_loss.backward()
        if (i + 1) % accum == 0:
            optimizer.step()
            optimizer.zero_grad()
