"""`amp` here is another library's module with apex-like names: it must not be touched."""
import torch
from mylib import amp


def train(model, optimizer, batches):
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
