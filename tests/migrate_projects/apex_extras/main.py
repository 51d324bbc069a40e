"""Shape: apex beyond amp's basics (issue 10, shape 12).

apex's non-AMP pieces travel with it: ``apex.optimizers.FusedAdam``,
``apex.parallel.convert_syncbn_model`` on a model with BatchNorm, ``apex.parallel.
DistributedDataParallel`` under a ``world_size > 1`` guard, ``@amp.float_function`` on a
numerically sensitive loss, ``amp.half_function`` around a helper, and
``amp.register_float_function(torch, "sigmoid")`` before ``amp.initialize``. Runs with the
apex stand-in in tests/fake_apex. Hard: each piece must be migrated to its torch
equivalent or reported precisely.
"""

import os

import torch
import torch.nn as nn
from apex import amp
from apex.optimizers import FusedAdam
from apex.parallel import DistributedDataParallel as ApexDDP
from apex.parallel import convert_syncbn_model


@amp.float_function
def focal_loss(logits, targets, gamma=2.0):
    probs = torch.sigmoid(logits)
    ce = nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = probs * targets + (1 - probs) * (1 - targets)
    return (ce * (1 - p_t) ** gamma).mean()


def features(x, scale):
    return x * scale


scaled_features = amp.half_function(features) if os.environ.get("HALF_FEATURES") else features


def main():
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    amp.register_float_function(torch, "sigmoid")
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 1))
    model = convert_syncbn_model(model)
    optimizer = FusedAdam(model.parameters(), lr=3e-3, weight_decay=0.01)
    model, optimizer = amp.initialize(model, optimizer, opt_level="O1", verbosity=0)
    if world_size > 1:
        model = ApexDDP(model, delay_allreduce=True)
    gen = torch.Generator().manual_seed(25)
    for step in range(8):
        x = scaled_features(torch.randn(16, 6, generator=gen), 0.5)
        targets = (torch.rand(16, 1, generator=gen) > 0.7).float()
        loss = focal_loss(model(x), targets)
        optimizer.zero_grad()
        with amp.scale_loss(loss, optimizer) as scaled_loss:
            scaled_loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item()!r}")
    print(f"final scale {amp.state_dict()['loss_scaler0']['loss_scale']!r}")


if __name__ == "__main__":
    main()
