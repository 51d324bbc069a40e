"""Benchmark: RoundPipe's asynchronous step vs its synchronous step vs a plain torch loop.

    python bench/runtime.py [--width 1024] [--batch 64] [--iterations 60] [--threads N]

Part 1: a wide MLP trained with Adam, sized so the optimizer step takes about as long as
forward + backward; iterations per second for the plain loop, RoundPipe with
``step(..., is_async=False)`` and RoundPipe's default asynchronous step, side by side.
Part 2: per-iteration overhead of the runtime on a tiny model (microseconds).
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F

import roundpipe
from roundpipe import RoundPipe


def mlp(width: int, depth: int = 4) -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1))


def data(width: int, batch: int, count: int):
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(batch, width, generator=gen), torch.randn(batch, 1, generator=gen)) for _ in range(count)]


def plain(net, batches):
    opt = roundpipe.optim.Adam(net.parameters(), lr=1e-4)
    start = time.perf_counter()
    for x, y in batches:
        F.mse_loss(net(x), y).backward()
        opt.step()
        opt.zero_grad()
    return time.perf_counter() - start


def with_roundpipe(net, batches, is_async: bool):
    model = RoundPipe(net)
    opt = roundpipe.optim.Adam(model.optim_parameters(), lr=1e-4)
    step_fn = lambda: (opt.step(), opt.zero_grad())
    start = time.perf_counter()
    for x, y in batches:
        model.forward_backward((x,), label=y, loss_fn=F.mse_loss)
        model.step(step_fn, is_async=is_async)
    model.synchronize()
    return time.perf_counter() - start


def phase_times(net, batches):
    """Seconds of forward+backward and of one Adam step, measured separately."""
    opt = roundpipe.optim.Adam(net.parameters(), lr=1e-4)
    fb, st = [], []
    for x, y in batches:
        t0 = time.perf_counter()
        F.mse_loss(net(x), y).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        st.append(time.perf_counter() - t1)
        fb.append(t1 - t0)
    return statistics.median(fb), statistics.median(st)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: leave)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, loadavg {os.getloadavg()}")

    batches = data(args.width, args.batch, args.iterations)
    fb, st = phase_times(mlp(args.width), batches[:10])
    params = sum(p.numel() for p in mlp(args.width).parameters())
    print(f"MLP width {args.width}, {params:,} params, batch {args.batch}: "
          f"forward+backward {fb * 1e3:.1f} ms, Adam step {st * 1e3:.1f} ms")
    times = {"plain": [], "sync": [], "async": []}
    for _ in range(args.rounds):  # interleaved so drift hits every case alike
        times["plain"].append(plain(mlp(args.width), batches))
        times["sync"].append(with_roundpipe(mlp(args.width), batches, is_async=False))
        times["async"].append(with_roundpipe(mlp(args.width), batches, is_async=True))
    rate = {k: args.iterations / statistics.median(v) for k, v in times.items()}
    for name, label in (("plain", "plain torch loop"), ("sync", "RoundPipe, is_async=False"),
                        ("async", "RoundPipe, async (default)")):
        print(f"  {label:<28} {rate[name]:7.2f} it/s")
    print(f"  async speed-up over sync:    {rate['async'] / rate['sync']:.2f}x")
    print(f"  async speed-up over plain:   {rate['async'] / rate['plain']:.2f}x")

    tiny = data(8, 4, 2000)
    plain_s = plain(torch.nn.Linear(8, 1), tiny)
    sync_s = with_roundpipe(torch.nn.Linear(8, 1), tiny, is_async=False)
    async_s = with_roundpipe(torch.nn.Linear(8, 1), tiny, is_async=True)
    print("tiny model (Linear(8, 1)), per iteration over 2000 iterations:")
    print(f"  plain torch loop {plain_s / 2000 * 1e6:7.1f} us; RoundPipe sync {sync_s / 2000 * 1e6:7.1f} us "
          f"(+{(sync_s - plain_s) / 2000 * 1e6:.1f}); async {async_s / 2000 * 1e6:7.1f} us "
          f"(+{(async_s - plain_s) / 2000 * 1e6:.1f})")
    print(f"loadavg at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
