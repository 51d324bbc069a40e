"""What a RoundPipe iteration allocates in steady state, measured without wall-clock time.

The runtime's own work between two backward passes (handing gradients to the optimizer
copies, zeroing and handing back the buffers, copying the weights into the model) allocates
nothing: the backward's gradients are the only new tensors, and the zeroed buffers they
replace are freed. So an iteration allocates what the equivalent plain torch loop
(``zero_grad(set_to_none=False)``: each gradient computed, then added) allocates, plus the
detached loss sum. Measured as the bytes torch's CPU allocator hands out (the profiler's memory events),
which depend neither on the machine's load nor on glibc's heap trimming; and as minor page
faults under an allocator that never returns memory to the kernel, where a fault can only
mean the process needed new memory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Callable, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from roundpipe import RoundPipe

ITERATIONS = 3
LOSS_SUM_BYTES = 4  # per iteration: the float32 copy of the loss that forward_backward returns


class _WithUnusedLayer(torch.nn.Module):
    """The test network plus a layer only the first iteration of each run uses: it gets
    no gradient in the other iterations."""

    def __init__(self, used: torch.nn.Module) -> None:
        super().__init__()
        self.used, self.sometimes = used, torch.nn.Linear(64, 64)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.used(self.sometimes(x) if self.calls % ITERATIONS == 1 else x)


def _net(with_unused_layer: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    return _WithUnusedLayer(net) if with_unused_layer else net


def _data() -> List[Tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 64, generator=gen), torch.randn(8, 1, generator=gen)) for _ in range(ITERATIONS)]


def _bytes_allocated(run: Callable[[], None]) -> int:
    """Bytes torch's CPU allocator hands out on this thread during ``run()``."""
    run()
    run()  # steady state: optimizer state, copies and gradient buffers exist
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    return sum(event.self_cpu_memory_usage for event in prof.events() if event.self_cpu_memory_usage > 0)


def _plain_loop(with_unused_layer: bool = False) -> Callable[[], None]:
    net = _net(with_unused_layer)
    opt = torch.optim.SGD(net.parameters(), lr=0.01, foreach=True)

    def run() -> None:
        for x, y in _data():
            F.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=False)

    return run


def _roundpipe_loop(is_async: bool, with_unused_layer: bool = False) -> Callable[[], None]:
    model = RoundPipe(_net(with_unused_layer))
    opt = torch.optim.SGD(model.optim_parameters(), lr=0.01, foreach=True)

    def step_fn() -> None:
        opt.step()
        opt.zero_grad()

    def run() -> None:
        for x, y in _data():
            model.forward_backward((x,), label=y, loss_fn=F.mse_loss)
            model.step(step_fn, is_async=is_async)
        model.synchronize()

    return run


@pytest.mark.parametrize("is_async", [False, True])
def test_an_iteration_allocates_what_the_plain_loop_does_plus_the_loss_sum(is_async):
    # The profiler sees the calling thread: all of a synchronous step (it runs inline),
    # the main thread's part of an asynchronous one (SGD without momentum allocates
    # nothing on the optimizer thread either).
    plain = _bytes_allocated(_plain_loop())
    ours = _bytes_allocated(_roundpipe_loop(is_async))
    assert plain > 0
    assert ours - plain == ITERATIONS * LOSS_SUM_BYTES


@pytest.mark.parametrize("is_async", [False, True])
def test_a_layer_without_gradients_costs_no_allocation(is_async):
    # A parameter the backward skips keeps the buffer it was given back: no new zeros
    # each iteration (the plain loop keeps its zeroed buffer and allocates nothing for it).
    plain = _bytes_allocated(_plain_loop(with_unused_layer=True))
    ours = _bytes_allocated(_roundpipe_loop(is_async, with_unused_layer=True))
    assert ours - plain == ITERATIONS * LOSS_SUM_BYTES


_FAULTS_SCRIPT = textwrap.dedent(
    """
    import resource, sys
    import torch, torch.nn.functional as F
    from roundpipe import RoundPipe

    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(4)])
    model = RoundPipe(net)
    opt = torch.optim.Adam(model.optim_parameters(), lr=1e-3, foreach=True)
    data = [(torch.randn(32, 256), torch.randn(32, 256)) for _ in range(10)]

    def step_fn():
        opt.step()
        opt.zero_grad()

    def run():
        for x, y in data:
            model.forward_backward((x,), label=y, loss_fn=F.mse_loss)
            model.step(step_fn, is_async=sys.argv[1] == "async")
        model.synchronize()

    run(); run()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        run()
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / (3 * len(data)))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings and ru_minflt")
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_no_page_faults_in_steady_state_when_the_allocator_keeps_its_memory(mode):
    # glibc normally gives freed memory at the top of its heap back to the kernel (and
    # faults it in again on the next allocation); with trimming and mmap off, a fault can
    # only come from memory the process did not need before. One gradient of this model
    # is 64 pages.
    env = dict(os.environ, MALLOC_TRIM_THRESHOLD_="4000000000", MALLOC_MMAP_THRESHOLD_="4000000000")
    result = subprocess.run(
        [sys.executable, "-c", _FAULTS_SCRIPT, mode], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split()[-1]) < 8
