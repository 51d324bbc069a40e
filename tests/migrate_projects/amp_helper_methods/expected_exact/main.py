"""Shape: an AMP helper class with separate methods (issue 10, shape 2), migrated: the --exact
target.

Autograd form through the helper: the model is wrapped where it is built, the optimizer takes
its copies, the helper and the GradScaler handed to it become RoundPipe's and the helper is
given the model; the clipping between ``amp.unscale`` and ``amp.optimizer_step`` clips the
copies (the unscale step is waited for), ``optimizer.zero_grad()`` also clears the model's
gradients, and the checkpoint holds the wrapped module's state.
"""

import roundpipe
import torch
import torch.nn as nn
import torch.nn.functional as F

from amp import AMPScaler

NUM_MICROBATCH = 1  # roundpipe-migrate: microbatches per batch; mean losses are divided by it


def train_one_epoch(model, loader, optimizer, amp, clip_grad):
    for step, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        if step % 2 == 0:
            amp.scale_loss(loss).backward()
        else:
            amp.backward(loss)
        amp.unscale(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.optim_parameters(), clip_grad)
        amp.optimizer_step(optimizer)
        print(f"step {step} loss {loss.item()!r} norm {norm.item()!r}")


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(7)
    loader = [(torch.randn(16, 10, generator=gen), torch.randint(0, 4, (16,), generator=gen)) for _ in range(6)]
    model = nn.Sequential(nn.Linear(10, 32), nn.GELU(), nn.Linear(32, 4))
    model = roundpipe.RoundPipe(model, model_run_config=roundpipe.RoundPipeRunConfig(num_microbatch=NUM_MICROBATCH))
    optimizer = torch.optim.AdamW(model.optim_parameters(), lr=3e-3)
    amp = AMPScaler(scaler=roundpipe.GradScaler(init_scale=2.0**12, growth_interval=2), model=model)
    train_one_epoch(model, loader, optimizer, amp, clip_grad=0.25)
    model.synchronize()
    state = {"model": model.model.state_dict(), "amp": amp.state_dict()}
    print(f"final scale {state['amp']['scale']!r} {amp.get_scale()!r}")


if __name__ == "__main__":
    main()
