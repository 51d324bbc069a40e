"""Autograd form: nanoGPT-style micro-steps, autocast held in a variable, the next batch
fetched between the forward and the backward; the step after the micro-step loop, its
clipping under a condition."""

import contextlib

import roundpipe
import torch

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train(model, get_batch, max_iters, micro_steps, dtype, grad_clip):
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=6e-4)
    scaler = roundpipe.GradScaler(enabled=(dtype == "float16") and torch.cuda.is_available())
    ctx = contextlib.nullcontext() if dtype == "float32" else torch.autocast("cuda", dtype=torch.float16)
    x, y = get_batch()
    for it in range(max_iters):
        for micro_step in range(micro_steps):
            with ctx:
                logits, loss = model(x, y)
                loss = loss / micro_steps  # scale the loss to account for accumulation
            x, y = get_batch()  # prefetch while the backward runs
            scaler.scale(loss).backward()

        def _step_fn():
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), grad_clip)
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        model.step(_step_fn)
        scaler.update()
        print(f"iter {it}: loss {loss.item() * micro_steps:.4f}")
