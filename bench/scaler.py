"""Benchmark: roundpipe.GradScaler against torch.amp.GradScaler, side by side in one process.

    python bench/scaler.py [--rounds 9] [--threads 1] [--elements 20000000] [--tensors 100]

Rows (each a ratio ours / torch measured inside each of ``--rounds`` interleaved rounds;
the median and the spread over rounds are printed):

* the drop-in loop (forward, ``scale(loss).backward()``, ``unscale_``, gradient clipping,
  ``step``, ``update``) on a 10k- and a 1M-parameter MLP;
* the main-thread cost of ``scale()`` + ``update()`` (1-parameter SGD, so pure overhead);
* ``unscale_`` of ``--elements`` fp32 gradients, also against one raw fused kernel call.

Load-independent counts are printed with them: voluntary context switches per drop-in
iteration (each hop to the optimizer thread and back blocks the main thread at least once),
Python function calls per drop-in iteration (the interpreter work the overhead is made of),
torch operator calls per drop-in iteration (the profiler's count: the C++ side) and scale
clones per ``update()``. Not part of the test suite. ``unscale_`` values are kept
O(1) by alternating the scale between 2 and 0.5 outside the timed region.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import roundpipe
from interleave import load, python_calls, ratio, ratio_row, rounds, timed, timed_both, torch_ops, voluntary_switches

MakeScaler = Callable[[], object]
SCALERS: Dict[str, MakeScaler] = {
    "torch": lambda: torch.amp.GradScaler("cpu"),
    "ours": roundpipe.GradScaler,
}


def mlp(width: int, depth: int) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers)


class DropInLoop:
    """One model, optimizer and scaler; ``run(n)`` trains n iterations of the drop-in loop."""

    def __init__(self, make_scaler: MakeScaler, width: int, depth: int, batch: int = 32) -> None:
        self.net = mlp(width, depth)
        self.params = list(self.net.parameters())
        self.opt = torch.optim.SGD(self.params, lr=1e-3, momentum=0.9)
        self.scaler = make_scaler()
        gen = torch.Generator().manual_seed(1)
        self.x = torch.randn(batch, width, generator=gen)
        self.y = torch.randn(batch, width, generator=gen)
        self.run(3)  # warm up lazy initialisation

    def run(self, iterations: int) -> None:
        scaler, opt = self.scaler, self.opt
        for _ in range(iterations):
            loss = F.mse_loss(self.net(self.x), self.y)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(self.params, 1.0)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()


def drop_in_rows(width: int, depth: int, iterations: int, count: int) -> None:
    """Each round builds fresh loops (untimed), so where their tensors land in memory varies
    from round to round instead of favouring one case; ``torch, again`` is a second torch
    loop, whose ratio to the first shows how much two identical loops differ."""
    makers = dict(SCALERS, **{"torch, again": SCALERS["torch"]})
    cpu: Dict[str, List[float]] = {name: [] for name in makers}
    switches: Dict[str, List[float]] = {name: [] for name in makers}

    def case(name: str) -> float:
        loop = DropInLoop(makers[name], width, depth)
        before = voluntary_switches()
        wall = timed_both(lambda: loop.run(iterations), cpu[name])
        switches[name].append((voluntary_switches() - before) / iterations)
        return wall

    seconds = rounds({name: lambda n=name: case(n) for name in makers}, count)
    params = sum(p.numel() for p in mlp(width, depth).parameters())
    per_iteration = {name: statistics.median(v) / iterations * 1e6 for name, v in seconds.items()}
    print(
        f"drop-in loop, MLP {depth}x{width} ({params:,} params), {iterations} iterations a round: "
        f"torch {per_iteration['torch']:.0f} us, ours {per_iteration['ours']:.0f} us per iteration"
    )
    print(ratio_row(f"drop-in loop {params:,} params, ours/torch", ratio(seconds, "ours", "torch"), "<= 1.05"))
    print(ratio_row("  the same, main-thread CPU time", ratio(cpu, "ours", "torch"), "<= 1.05"))
    print(ratio_row("  control: torch/torch, main-thread CPU time", ratio(cpu, "torch, again", "torch")))
    least = {name: min(v) / iterations * 1e6 for name, v in cpu.items()}
    print(
        "    least main-thread CPU per iteration over the rounds (other load only adds to it): "
        + ", ".join(f"{name} {us:.1f} us" for name, us in least.items())
        + f"; ours/torch {least['ours'] / least['torch']:.3f}x, torch again/torch "
        f"{least['torch, again'] / least['torch']:.3f}x"
    )
    print(
        "    voluntary context switches per iteration: "
        + ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in switches.items())
    )
    warmed = {name: DropInLoop(make, width, depth) for name, make in SCALERS.items()}
    calls = {name: python_calls(lambda loop=loop: loop.run(10)) / 10 for name, loop in warmed.items()}
    print("    Python function calls per iteration: " + ", ".join(f"{name} {n:.0f}" for name, n in calls.items()))
    ops = {name: torch_ops(lambda loop=loop: loop.run(10)) / 10 for name, loop in warmed.items()}
    print("    torch operator calls per iteration: " + ", ".join(f"{name} {n:.0f}" for name, n in ops.items()))


class ScaleUpdate:
    """Main-thread seconds of scale() + update() per iteration, step excluded (``clock``:
    ``time.perf_counter`` for wall time, ``time.thread_time`` for this thread's CPU time)."""

    def __init__(self, make_scaler: MakeScaler) -> None:
        self.scaler = make_scaler()
        self.param = torch.nn.Parameter(torch.zeros(1))
        self.opt = torch.optim.SGD([self.param], lr=0.0)
        self.loss = torch.ones((), requires_grad=True)
        self.grad = torch.ones(1)
        self.run(50)

    def run(self, iterations: int, clock: Callable[[], float] = time.perf_counter) -> float:
        scaler, spent = self.scaler, []
        for _ in range(iterations):
            start = clock()
            scaler.scale(self.loss)
            mid = clock()
            self.param.grad = self.grad
            scaler.step(self.opt)
            resume = clock()
            scaler.update()
            spent.append(mid - start + clock() - resume)
        return statistics.median(spent)


def scale_update_row(count: int, iterations: int = 400) -> None:
    cases = {name: ScaleUpdate(make) for name, make in SCALERS.items()}
    seconds = rounds({name: lambda c=case: c.run(iterations) for name, case in cases.items()}, count)
    cpu = rounds({name: lambda c=case: c.run(iterations, time.thread_time) for name, case in cases.items()}, count)
    clones = count_clones(cases["ours"], iterations)
    med = {name: statistics.median(v) * 1e6 for name, v in seconds.items()}
    print(
        f"scale() + update() per iteration (median of {iterations} a round): "
        f"torch {med['torch']:.1f} us, ours {med['ours']:.1f} us"
    )
    print(ratio_row("scale()+update(), ours/torch", ratio(seconds, "ours", "torch"), "<= 1.3"))
    print(ratio_row("  the same, main-thread CPU time", ratio(cpu, "ours", "torch"), "<= 1.3"))
    print(f"    scale clones per update(): {clones:.2f}")


def count_clones(case: ScaleUpdate, iterations: int) -> float:
    """Tensor clones made while ``case`` runs (counted by wrapping Tensor.clone)."""
    original = torch.Tensor.clone
    made = 0

    def counting_clone(self: torch.Tensor, *args, **kwargs):
        nonlocal made
        made += 1
        return original(self, *args, **kwargs)

    torch.Tensor.clone = counting_clone  # type: ignore[method-assign]
    try:
        case.run(iterations)
    finally:
        torch.Tensor.clone = original  # type: ignore[method-assign]
    return made / iterations


def make_grads(elements: int, tensors: int, seed: int = 0) -> List[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.rand(tensors, generator=gen) + 0.1
    sizes = (sizes / sizes.sum() * elements).long().clamp(min=1)
    params = []
    for size in sizes.tolist():
        p = torch.nn.Parameter(torch.zeros(size))
        p.grad = torch.randn(size, generator=gen)
        params.append(p)
    return params


def time_unscale(scaler, optimizer, repeats: int) -> float:
    times = []
    for i in range(repeats):
        scaler.scale(torch.ones(()))
        times.append(timed(lambda: scaler.unscale_(optimizer)))
        scaler.update(new_scale=2.0 if i % 2 else 0.5)
    return statistics.median(times)


def time_raw_kernel(params, repeats: int) -> float:
    grads = [p.grad for p in params]
    times = []
    for i in range(repeats):
        found_inf = torch.zeros(())
        inv = torch.tensor(2.0 if i % 2 else 0.5)
        times.append(timed(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv)))
    return statistics.median(times)


def unscale_rows(elements: int, tensors: int, count: int, repeats: int = 7) -> None:
    params = make_grads(elements, tensors)
    optimizer = torch.optim.SGD(params, lr=0.0)
    scalers = {name: make() for name, make in SCALERS.items()}
    for scaler in scalers.values():
        time_unscale(scaler, optimizer, 2)  # warm up
    cases = {name: lambda s=scaler: time_unscale(s, optimizer, repeats) for name, scaler in scalers.items()}
    cases["raw"] = lambda: time_raw_kernel(params, repeats)
    seconds = rounds(cases, count)
    med = {name: statistics.median(v) * 1e3 for name, v in seconds.items()}
    print(
        f"unscale_ of {elements:,} fp32 grads in {len(params)} tensors (median of {repeats} a round): "
        f"torch {med['torch']:.2f} ms, ours {med['ours']:.2f} ms, raw kernel {med['raw']:.2f} ms"
    )
    print(ratio_row("unscale_, ours/torch", ratio(seconds, "ours", "torch"), "<= 1.1"))
    print(ratio_row("unscale_, ours/raw kernel", ratio(seconds, "ours", "raw")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--elements", type=int, default=20_000_000)
    parser.add_argument("--tensors", type=int, default=100)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, intra-op threads {torch.get_num_threads()}, "
        f"{args.rounds} interleaved rounds; {load()}"
    )
    drop_in_rows(width=70, depth=2, iterations=200, count=args.rounds)
    drop_in_rows(width=500, depth=4, iterations=20, count=args.rounds)
    scale_update_row(args.rounds)
    unscale_rows(args.elements, args.tensors, args.rounds)
    print(f"at the end: {load()}")


if __name__ == "__main__":
    main()
