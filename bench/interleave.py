"""Side-by-side timing for the bench scripts: interleaved rounds, per-round ratios.

Each round times every case once, in an order that alternates from round to round, so slow
drift of the machine (other processes, frequency, memory bandwidth) hits every case alike. A
ratio is computed inside each round (case / baseline of that round); the row reports the
median of those ratios and their spread (min–max), never a ratio of medians from different
moments.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

Case = Callable[[], float]
"""A case runs one timed round and returns the seconds it measured."""


def load() -> str:
    """The 1/5/15-minute load average, for the printed conditions."""
    return "loadavg " + " / ".join(f"{value:.2f}" for value in os.getloadavg())


def minor_faults() -> int:
    """Minor page faults of this process so far (independent of machine load)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _profiled_events(fn: Callable[[], None], profile_memory: bool = False) -> List[Any]:
    """The events torch's CPU profiler records on this thread while ``fn`` runs (every
    dispatcher call, nested ones included; with ``profile_memory``, the allocator's events)."""
    from torch.profiler import ProfilerActivity, profile  # here: the migrate benches run without torch

    with profile(activities=[ProfilerActivity.CPU], profile_memory=profile_memory) as prof:
        fn()
    return list(prof.events())


def bytes_allocated(fn: Callable[[], None]) -> int:
    """Bytes torch's CPU allocator hands out on this thread while ``fn`` runs (the
    profiler's memory events): what an iteration allocates, whatever the load and however
    glibc trims its heap. Work on other threads is not seen."""
    events = _profiled_events(fn, profile_memory=True)
    return sum(event.self_cpu_memory_usage for event in events if event.self_cpu_memory_usage > 0)


def torch_ops(fn: Callable[[], None]) -> int:
    """Operator calls torch's profiler records on this thread while ``fn`` runs: the C++
    side of an overhead, counted."""
    return len(_profiled_events(fn))


def voluntary_switches() -> int:
    """Voluntary context switches of this process so far: a thread that blocks (a hop to
    another thread and back) adds at least one, whatever the load."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


def python_calls(fn: Callable[[], None]) -> int:
    """Python-level function calls made while ``fn`` runs on this thread (a count of the
    interpreter work an overhead is made of, independent of the load)."""
    calls = 0

    def count(frame: object, event: str, arg: object) -> None:
        nonlocal calls
        if event == "call":
            calls += 1

    sys.setprofile(count)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def timed(fn: Callable[[], None]) -> float:
    """Seconds one call of ``fn`` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def timed_both(fn: Callable[[], None], cpu: List[float]) -> float:
    """Wall seconds of one call of ``fn``; its CPU seconds on this thread go to ``cpu``.

    Thread CPU time leaves out the time other processes took the core, so on a loaded
    machine it is the steadier measure, valid when all the work runs on this thread.
    """
    wall, thread = time.perf_counter(), time.thread_time()
    fn()
    cpu.append(time.thread_time() - thread)
    return time.perf_counter() - wall


def thread_cpu_clock(name: str) -> Callable[[], float]:
    """A clock of the CPU seconds used so far by the live thread called ``name`` (Linux:
    its pthread CPU-time clock, read from any thread)."""
    thread = next(t for t in threading.enumerate() if t.name == name)
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    return lambda: time.clock_gettime(clock)


class CpuShares:
    """Timed rounds of one case that also record CPU seconds: the calling thread's, a
    second thread's (``other``: its CPU clock, if given) and the whole process's, per round."""

    def __init__(self, fn: Callable[[], None], other: Callable[[], float] = lambda: 0.0) -> None:
        self._fn, self._other = fn, other
        self.main: List[float] = []
        self.other: List[float] = []
        self.process: List[float] = []

    def __call__(self) -> float:
        main, other, process = time.thread_time(), self._other(), time.process_time()
        wall = timed(self._fn)
        self.main.append(time.thread_time() - main)
        self.other.append(self._other() - other)
        self.process.append(time.process_time() - process)
        return wall


def rounds(cases: Dict[str, Case], count: int) -> Dict[str, List[float]]:
    """Run ``count`` rounds of every case, order alternating; seconds per case per round."""
    names = list(cases)
    seconds: Dict[str, List[float]] = {name: [] for name in names}
    for index in range(count):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            seconds[name].append(cases[name]())
    return seconds


def ratio(seconds: Dict[str, List[float]], case: str, baseline: str) -> Tuple[float, float, float]:
    """Median, min and max over rounds of ``case``'s time divided by ``baseline``'s."""
    per_round = [c / b for c, b in zip(seconds[case], seconds[baseline])]
    return statistics.median(per_round), min(per_round), max(per_round)


def ratio_row(label: str, values: Sequence[float], target: str = "") -> str:
    """One printed row: ``label  median x  (spread min–max)  target``."""
    median, low, high = values
    suffix = f"  target {target}" if target else ""
    return f"  {label:<52} {median:6.3f}x  (spread {low:.3f}–{high:.3f}){suffix}"
