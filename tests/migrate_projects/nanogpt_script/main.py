"""Shape: a nanoGPT-style training script at module level (issue 10, shapes 5, 6 and 7).

Everything runs at module level, not in a function: configuration globals, ``ctx =
nullcontext() if device_type == "cpu" and dtype == "float32" else torch.amp.autocast(...)``,
``scaler = torch.amp.GradScaler(..., enabled=(dtype == "bfloat16"))``, ``raw_model = model``,
and a ``while True`` loop that sets the learning rate by hand, evaluates every
``eval_interval`` iterations with an ``estimate_loss()`` under ``@torch.no_grad()`` that
switches ``model.eval()``/``model.train()``, checkpoints ``raw_model.state_dict()`` when the
validation loss improves, and accumulates over micro-steps with the next batch fetched
right after each forward. Hard: module-level names instead of locals, the eval function
reads the global model, and the loop ends on ``break``.
"""

import io
import math
from contextlib import nullcontext

import torch

from model import TinyLM

# -----------------------------------------------------------------------------
eval_interval = 3
eval_iters = 2
max_iters = 7
gradient_accumulation_steps = 2
batch_size = 4
block_size = 8
vocab = 32
learning_rate = 6e-3
decay_lr = True
warmup_iters = 2
lr_decay_iters = 7
min_lr = 6e-4
grad_clip = 1.0
device_type = "cpu"
dtype = "bfloat16"
# -----------------------------------------------------------------------------

torch.manual_seed(1337)
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
ctx = (
    nullcontext()
    if device_type == "cpu" and dtype == "float32"
    else torch.amp.autocast(device_type=device_type, dtype=ptdtype)
)

train_data = torch.randint(0, vocab, (1500,), generator=torch.Generator().manual_seed(3))
val_data = torch.randint(0, vocab, (400,), generator=torch.Generator().manual_seed(4))
batch_gen = torch.Generator().manual_seed(5)


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=batch_gen)
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


iter_num = 0
best_val_loss = 1e9
model = TinyLM(vocab_size=vocab, block_size=block_size)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "bfloat16"), init_scale=2.0**10, growth_interval=3)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
raw_model = model  # unwrap DDP container if needed


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            with ctx:
                logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


checkpoint_buffer = io.BytesIO()
X, Y = get_batch("train")  # fetch the very first batch
while True:
    lr = get_lr(iter_num) if decay_lr else learning_rate
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"eval {iter_num} train {losses['train'].item()!r} val {losses['val'].item()!r}")
        if losses["val"] < best_val_loss:
            best_val_loss = losses["val"]
            if iter_num > 0:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                }
                checkpoint_buffer = io.BytesIO()
                torch.save(checkpoint, checkpoint_buffer)

    for micro_step in range(gradient_accumulation_steps):
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        # immediately async prefetch next batch while model is doing the forward pass on the GPU
        X, Y = get_batch("train")
        scaler.scale(loss).backward()
    if grad_clip != 0.0:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)

    lossf = loss.item() * gradient_accumulation_steps
    print(f"step {iter_num} loss {lossf!r} lr {lr!r}")
    iter_num += 1
    if iter_num > max_iters:
        break

print(f"checkpoint bytes {len(checkpoint_buffer.getvalue()) > 0!r}")
print(f"final scale {scaler.get_scale()!r}")
