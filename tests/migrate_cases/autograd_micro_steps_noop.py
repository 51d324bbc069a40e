"""No-op twin of autograd_micro_steps: the same loop already in RoundPipe's autograd form
(it mentions GradScaler, so it gets past the prefilter) is left alone."""

import contextlib

import roundpipe
import torch


def train(model, get_batch, max_iters, micro_steps, grad_clip):
    model = roundpipe.RoundPipe(model)
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=6e-4)
    scaler = roundpipe.GradScaler("cuda")
    x, y = get_batch()
    for it in range(max_iters):
        for micro_step in range(micro_steps):
            with torch.autocast("cuda", dtype=torch.float16):
                logits, loss = model(x, y)
                loss = loss / micro_steps
            x, y = get_batch()
            scaler.scale(loss).backward()

        def step_fn():
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), grad_clip)
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        model.step(step_fn)
        scaler.update()
