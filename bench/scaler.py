"""Benchmark: roundpipe.GradScaler.unscale_ vs torch's vs one raw fused kernel call.

Same grads, same process, interleaved; prints medians and ratios. Also the main-thread
cost of scale() + update() per iteration with asynchronous (queued) steps.

    python bench/scaler.py [--elements 20000000] [--tensors 100] [--repeats 15]

Not part of the test suite. Values are kept O(1) by alternating the scale between 2 and
0.5 outside the timed region (dividing by 65536 over and over would drift into subnormals).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

import roundpipe
from roundpipe import optim_stream


def make_grads(elements: int, tensors: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.rand(tensors, generator=gen) + 0.1
    sizes = (sizes / sizes.sum() * elements).long().clamp(min=1)
    params = []
    for size in sizes.tolist():
        p = torch.nn.Parameter(torch.zeros(size))
        p.grad = torch.randn(size, generator=gen)
        params.append(p)
    return params


def time_unscale(scaler, optimizer, repeats: int, warmup: int = 3):
    times = []
    for i in range(warmup + repeats):
        scaler.scale(torch.ones(()))
        start = time.perf_counter()
        scaler.unscale_(optimizer)
        elapsed = time.perf_counter() - start
        scaler.update(new_scale=2.0 if i % 2 else 0.5)
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def time_raw_kernel(params, repeats: int, warmup: int = 3):
    grads = [p.grad for p in params]
    times = []
    for i in range(warmup + repeats):
        found_inf = torch.zeros(())
        inv = torch.tensor(2.0 if i % 2 else 0.5)
        start = time.perf_counter()
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)
        elapsed = time.perf_counter() - start
        if i >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def time_scale_update_overhead(scaler, queued: bool, iterations: int = 2000):
    """Main-thread seconds per iteration spent in scale() + update().

    ``queued``: the step runs on the optimizer thread while update() runs (async mode);
    otherwise it runs inline on the main thread first (torch's plain loop).
    """
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.0)
    loss = torch.ones((), requires_grad=True)
    spent = []
    for _ in range(iterations):
        start = time.perf_counter()
        scaled = scaler.scale(loss)
        mid = time.perf_counter()
        param.grad = torch.ones(1)
        job = optim_stream.launch(scaler.step, optimizer) if queued else scaler.step(optimizer)
        resume = time.perf_counter()
        scaler.update()
        end = time.perf_counter()
        if queued:
            job.wait()
        spent.append((mid - start) + (end - resume))
        del scaled
    return statistics.median(spent[100:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=20_000_000)
    parser.add_argument("--tensors", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, loadavg {os.getloadavg()}")
    params = make_grads(args.elements, args.tensors)
    optimizer = torch.optim.SGD(params, lr=0.0)
    results = {"ours": [], "torch": [], "raw": []}
    for _ in range(3):  # interleave rounds so drift hits every case alike
        results["ours"].append(time_unscale(roundpipe.GradScaler(), optimizer, args.repeats))
        results["torch"].append(time_unscale(torch.amp.GradScaler("cpu"), optimizer, args.repeats))
        results["raw"].append(time_raw_kernel(params, args.repeats))
    med = {name: statistics.median(values) for name, values in results.items()}
    print(f"{args.elements:,} fp32 grads in {len(params)} tensors, median of {args.repeats} x 3 rounds")
    for name in ("ours", "torch", "raw"):
        print(f"  unscale_ {name:>5}: {med[name] * 1e3:8.3f} ms")
    print(f"  ratio ours/torch: {med['ours'] / med['torch']:.3f}")
    print(f"  ratio ours/raw:   {med['ours'] / med['raw']:.3f}")
    print(f"  ratio torch/raw:  {med['torch'] / med['raw']:.3f}")
    print("main-thread scale()+update() per iteration (median of 1900):")
    torch_plain = time_scale_update_overhead(torch.amp.GradScaler("cpu"), queued=False)
    ours_plain = time_scale_update_overhead(roundpipe.GradScaler(), queued=False)
    ours_async = time_scale_update_overhead(roundpipe.GradScaler(), queued=True)
    print(f"  torch, plain loop:                      {torch_plain * 1e6:7.1f} us")
    print(f"  ours, plain loop:                       {ours_plain * 1e6:7.1f} us")
    print(f"  ours, async (step queued, running):     {ours_async * 1e6:7.1f} us")
    print(f"loadavg at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
