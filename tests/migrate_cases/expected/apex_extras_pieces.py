"""apex's fused optimizer, SyncBN conversion, guarded DDP and function casting (issue 10, shape 12)."""

import os

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


@roundpipe.compat.float_function
def stable_loss(logits, targets):
    return torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)


def train(model, batches):
    roundpipe.compat.register_float_function(torch, "sigmoid")
    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, fused=True)  # AdamW's rule
    model, optimizer = roundpipe.compat.initialize(model, optimizer, opt_level="O1")
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise RuntimeError("apex DDP was removed by roundpipe-migrate: RoundPipe trains in one process on this machine")
    amp_scaler = roundpipe.compat.loss_scaler()
    for x, y in batches:

        def _loss_fn(_outputs, y):
            loss = stable_loss(_outputs, y)
            return amp_scaler.scale(loss) / NUM_MICROBATCH

        model.forward_backward(input_args=(x,), label=y, loss_fn=_loss_fn)

        def _step_fn():
            amp_scaler.step(optimizer)
            optimizer.zero_grad()

        model.step(_step_fn)
        amp_scaler.update()
