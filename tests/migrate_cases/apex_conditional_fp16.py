import torch
from apex import amp


def train(model, optimizer, batches, fp16):
    if fp16:
        model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        if fp16:
            with amp.scale_loss(loss, optimizer) as scaled_loss:
                scaled_loss.backward()
        else:
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
