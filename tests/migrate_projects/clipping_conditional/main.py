"""Shape: clipping under a condition, grad norms logged and returned (issue 10, shape 9).

``train_step`` unscales and clips only when ``clip_grad`` is set and only on the AMP
branch; otherwise it measures the norm by hand for the log (``clip_grad_norm_`` with an
infinite max norm); the norm is returned with the loss and printed. Every other step skips
clipping (``clip_every``). Hard: the unscale/clip pair is conditional, and the norm leaves
the step as a value the caller uses.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def compute_grad_norm(parameters, norm_type=2.0):
    grads = [p.grad.detach() for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type)


def train_step(model, optimizer, scaler, batch, use_amp, clip_grad=None):
    x, y = batch
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
        loss = F.cross_entropy(model(x).float(), y)
    if use_amp:
        scaler.scale(loss).backward()
        if clip_grad is not None:
            scaler.unscale_(optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        else:
            grad_norm = compute_grad_norm(model.parameters()) / scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        grad_norm = compute_grad_norm(model.parameters())
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), grad_norm


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=3)
    gen = torch.Generator().manual_seed(18)
    clip_every = 2
    for step in range(8):
        batch = (torch.randn(12, 8, generator=gen) * 3, torch.randint(0, 4, (12,), generator=gen))
        clip = 0.3 if step % clip_every == 0 else None
        loss, grad_norm = train_step(model, optimizer, scaler, batch, use_amp=True, clip_grad=clip)
        print(f"step {step} loss {loss.item()!r} grad_norm {grad_norm.item()!r}")
    print(f"final scale {scaler.get_scale()!r}")


if __name__ == "__main__":
    main()
