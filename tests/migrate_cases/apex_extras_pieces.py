"""apex's fused optimizer, SyncBN conversion, guarded DDP and function casting (issue 10, shape 12)."""

import os

import torch
from apex import amp
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel as DDP
from apex.parallel import convert_syncbn_model


@amp.float_function
def stable_loss(logits, targets):
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)


def train(model, batches):
    amp.register_float_function(torch, "sigmoid")
    model = convert_syncbn_model(model)
    optimizer = FusedAdam(model.parameters(), 1e-3, weight_decay=0.01)  # AdamW's rule
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        model = DDP(model, delay_allreduce=True)
    for x, y in batches:
        loss = stable_loss(model(x), y)
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        optimizer.zero_grad()
