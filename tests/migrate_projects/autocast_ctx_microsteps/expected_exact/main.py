"""Shape: autocast in a variable, ``enabled=`` a flag, micro-steps (issue 10, shapes 4-7),
migrated by hand: the --exact target.

Autograd form: the micro-step loop, the autocast variable, the batch fetch between forward
and backward and the loss divisor stay as written; the model is wrapped and the optimizer
takes its copies; the ``param_groups`` lr write, the clipping (on the copies), the step and
``zero_grad`` move into the step function, in their original order.

Original docstring:

nanoGPT-style: ``ctx = nullcontext() if dtype == "float32" else torch.autocast(...)`` is
built once and entered in every micro-step; the scaler is ``GradScaler(enabled=...)`` on
the dtype string; gradients accumulate over an inner ``for micro_step`` loop with the loss
divided by the step count, and the next batch is fetched between the forward and the
backward; the learning rate is written into ``param_groups`` by hand before each step.
Hard: the step comes after the inner loop, the logged loss is the last micro-step's loss
times the count, and the batch fetch must keep its place.
"""

import argparse
import math
from contextlib import nullcontext

import roundpipe
import torch

from model import TinyLM

block_size, batch_size, vocab = 8, 6, 32
gradient_accumulation_steps = 3
learning_rate, min_lr, warmup_iters, lr_decay_iters = 6e-3, 6e-4, 2, 8
grad_clip = 1.0

data = torch.randint(0, vocab, (2000,), generator=torch.Generator().manual_seed(21))
data_gen = torch.Generator().manual_seed(22)


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=data_gen)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x, y


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(decay_ratio, 1.0)))
    return min_lr + coeff * (learning_rate - min_lr)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--max_iters", type=int, default=6)
    args = parser.parse_args()
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    ctx = nullcontext() if args.dtype == "float32" else torch.amp.autocast(device_type="cpu", dtype=ptdtype)
    torch.manual_seed(1337)
    model = roundpipe.RoundPipe(TinyLM(vocab_size=vocab, block_size=block_size))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    scaler = roundpipe.GradScaler(enabled=(args.dtype == "bfloat16"))
    X, Y = get_batch()
    for iter_num in range(args.max_iters):
        lr = get_lr(iter_num)
        for micro_step in range(gradient_accumulation_steps):
            with ctx:
                logits, loss = model(X, Y)
                loss = loss / gradient_accumulation_steps
            X, Y = get_batch()
            scaler.scale(loss).backward()

        def step_fn():
            for param_group in optimizer.param_groups:
                param_group["lr"] = lr
            if grad_clip != 0.0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.optim_parameters(), grad_clip)
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)

        model.step(step_fn, is_async=False)
        scaler.update()
        lossf = loss.item() * gradient_accumulation_steps
        print(f"step {iter_num} loss {lossf!r} lr {lr!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
