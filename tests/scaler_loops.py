"""Training loops shared by the GradScaler tests: the same seeded data and fault pattern,
run with torch's scaler or ours, on the main thread or on the optimizer thread.

A fault pattern entry is 0 (clean), "inf" or "nan": that value is written into one gradient
element after backward, so the overflow pattern does not depend on the scale.
"""

from __future__ import annotations

import struct
from typing import Callable, List, Sequence, Tuple

import torch

from roundpipe import optim_stream

MODES = ("plain", "job_wait", "async")


def make_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


def batches(steps: int, seed: int = 1) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=gen), torch.randn(8, 2, generator=gen)) for _ in range(steps)]


def inject(model: torch.nn.Module, fault) -> None:
    if fault:
        with torch.no_grad():
            next(model.parameters()).grad.view(-1)[0] = float(fault)


def train(
    make_scaler: Callable[[], object],
    pattern: Sequence,
    mode: str = "plain",
    make_optimizers: Callable[[torch.nn.Module], list] = lambda m: [
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    ],
    clip: float = 0.0,
    device: str = "cpu",
):
    """Run one training loop; return (scales after each update, skipped flags, params).

    Modes: ``plain`` calls unscale_/step on the main thread; ``job_wait`` queues the step
    function on the optimizer thread and waits for it before ``update()``; ``async`` queues it
    and calls ``update()`` without waiting (waiting for it only before the next backward).
    On CUDA the step function zeroes grads in place instead of freeing them: memory made on
    the main stream must not be freed by the optimizer stream while the main stream runs on.
    """
    model = make_model().to(device)
    optimizers = make_optimizers(model)
    scaler = make_scaler()
    scales, skipped = [], []
    for (x, y), fault in zip(batches(len(pattern)), pattern):
        x, y = x.to(device), y.to(device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        inject(model, fault)
        before = [p.detach().clone() for p in model.parameters()]

        def step_fn():
            for opt in optimizers:
                if clip:
                    scaler.unscale_(opt)
                    params = [p for g in opt.param_groups for p in g["params"]]
                    torch.nn.utils.clip_grad_norm_(params, clip)
                scaler.step(opt)
                opt.zero_grad(set_to_none=device == "cpu")

        if mode == "plain":
            step_fn()
        else:
            job = optim_stream.launch(step_fn)
            if mode == "job_wait":
                job.wait()
        scaler.update()
        if mode == "async":
            optim_stream.synchronize()
        scales.append(scaler.get_scale())
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
    return scales, skipped, [p.detach().clone() for p in model.parameters()]


def f32(x: float) -> float:
    """Round a Python float to float32 (independent of torch)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def reference_scales(
    init: float,
    found: Sequence[bool],
    growth: float = 2.0,
    backoff: float = 0.5,
    interval: int = 2000,
    lag: int = 0,
    min_scale: float = None,
    max_scale: float = None,
) -> List[float]:
    """Scale after each update, written independently of torch and roundpipe.

    ``lag=0``: update k applies iteration k's result (torch). ``lag=1``: update k applies
    iteration k-1's result, and update 1 applies nothing (asynchronous RoundPipe).
    """
    scale, tracker, out = f32(init), 0, []
    for k in range(len(found)):
        j = k - lag
        if j >= 0:
            if found[j]:
                scale, tracker = f32(scale * backoff), 0
            else:
                tracker += 1
                if tracker == interval:
                    grown = f32(scale * growth)
                    if grown != float("inf"):
                        scale = grown
                    tracker = 0
            if min_scale is not None:
                scale = max(scale, f32(min_scale))
            if max_scale is not None:
                scale = min(scale, f32(max_scale))
        out.append(scale)
    return out
