import torch


def train(model, optimizer, batches, fp16):
    # fp16 training used to go through apex here; this version trains in fp32 only.
    for x, y in batches:
        loss = (model(x) - y).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
