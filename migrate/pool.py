"""Worker processes for ``roundpipe-migrate -j N``.

Work is sent in chunks (costly tasks alone or in small chunks, cheap ones in larger
chunks) and the results come back in the order the tasks were given. The workers ignore
SIGINT (the parent decides what an interrupt means) and die with their parent: on Linux
the kernel kills them when the parent dies (``PR_SET_PDEATHSIG``), elsewhere a watcher
thread notices the parent is gone. A killed ``-j`` run leaves no processes behind.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import ctypes
import ctypes.util
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Callable, Iterator, List, Sequence, TypeVar

__all__ = ["run_in_workers"]

T = TypeVar("T")
R = TypeVar("R")

_PR_SET_PDEATHSIG = 1
_WATCH_INTERVAL_S = 0.2


def run_in_workers(
    tasks: Sequence[T],
    costly: Sequence[bool],
    worker: Callable[[T], R],
    processes: int,
    lost: Callable[[T], R],
) -> Iterator[R]:
    """``worker``'s result for each task, in task order, computed in ``processes`` worker
    processes (``worker`` must pickle). Costly tasks are sent first, two at a time; the
    others in chunks of up to 64 after them.

    If a worker process dies (a crash in native code, the OOM killer), the pool is broken:
    every task whose result had not come back yet gets ``lost(task)`` instead. If the
    consumer stops early (an exception, an interrupt), queued tasks are cancelled and the
    workers are terminated.
    """
    order = sorted(range(len(tasks)), key=lambda index: not costly[index])
    chunks = _chunks(order, costly)
    pool = None
    finished = False
    try:
        with _sigint_held():  # a Ctrl-C while forking would be lost in fork hooks
            pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=min(processes, len(chunks)),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
            futures = [pool.submit(_run_chunk, worker, [tasks[i] for i in chunk]) for chunk in chunks]
        place = {index: (n, k) for n, chunk in enumerate(chunks) for k, index in enumerate(chunk)}
        for index in range(len(tasks)):
            n, k = place[index]
            try:
                result = futures[n].result()[k]
            except concurrent.futures.process.BrokenProcessPool:
                result = lost(tasks[index])
            yield result
        finished = True
    finally:
        if pool is not None and not finished:
            pool.shutdown(wait=False, cancel_futures=True)
            for child in multiprocessing.active_children():
                child.terminate()
        if pool is not None:
            pool.shutdown(wait=True)


@contextlib.contextmanager
def _sigint_held() -> Iterator[None]:
    """Hold SIGINT back while the block runs; one that arrived is raised after it. The
    workers forked inside inherit the hold and drop it once they ignore SIGINT."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _chunks(order: Sequence[int], costly: Sequence[bool]) -> List[List[int]]:
    """``order`` cut into chunks: costly tasks two by two, the others by 64."""
    chunks: List[List[int]] = []
    for index in order:
        size = 2 if costly[index] else 64
        if chunks and len(chunks[-1]) < size and costly[chunks[-1][0]] == costly[index]:
            chunks[-1].append(index)
        else:
            chunks.append([index])
    return chunks


def _run_chunk(worker: Callable[[T], R], chunk: Sequence[T]) -> List[R]:
    return [worker(task) for task in chunk]


def _start_worker(parent: int) -> None:
    """Initializer of each worker: ignore SIGINT, and die when ``parent`` does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    if not _kernel_kills_orphans():
        threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    if os.getppid() != parent:  # the parent died before the watch began
        os._exit(1)


def _kernel_kills_orphans() -> bool:
    """Ask Linux to SIGKILL this process when its parent dies; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return bool(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0)


def _watch_parent(parent: int) -> None:
    """Exit this worker as soon as ``parent`` is no longer its parent."""
    while os.getppid() == parent:
        time.sleep(_WATCH_INTERVAL_S)
    os._exit(1)
