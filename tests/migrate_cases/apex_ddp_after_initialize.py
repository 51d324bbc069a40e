"""Diagnostic RPM114: on the apex path the model is wrapped in torch's
DistributedDataParallel after `amp.initialize` (NVIDIA's ImageNet example); detected like
the torch.amp case, file left unchanged."""

import torch
from apex import amp


def main(loader):
    model = torch.nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    model = torch.nn.parallel.DistributedDataParallel(model)
    for x, y in loader:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
