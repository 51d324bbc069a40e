"""The optimizer thread: one named daemon worker that runs queued jobs in FIFO order.

RoundPipe runs optimizer work (step functions, the GradScaler's unscale/step) on this thread
so that the main thread can go on with the next forward pass. This module owns that thread
and every wait on it.

Contracts:

* **Order.** Jobs run one at a time in launch order. Each job gets a sequence number
  (1, 2, ...). Waiting for job ``n`` means every job up to ``n`` has finished.
* **Errors.** A job that raises never kills the process and never hangs a waiter. The first
  failure is kept and raised, as the original exception object (its traceback shows the
  optimizer-thread frames, and a note names the job), by the next wait that covers it. Jobs
  launched before that error is delivered are cancelled (not run), since they would run on
  top of a half-done step; jobs launched afterwards run normally.
* **Waits.** Only non-optimizer threads may wait (a wait from the optimizer thread would
  deadlock and raises ``RuntimeError``). Waits poll in short slices, so Ctrl-C is handled
  promptly; the ``KeyboardInterrupt`` carries a note with the optimizer thread's stack and the
  reason for the wait. A dead worker raises instead of hanging.
* **The waited watermark.** :func:`waited_seq` is the highest sequence number a waiter has
  waited for. It only moves when some thread waits, so it is deterministic for a given
  program, whatever the thread timing; the GradScaler's scale sequence is built on it.
* **fork.** A child forked while the optimizer was idle starts with a fresh stream that
  continues the parent's numbering and watermark (and keeps an error nobody had waited
  for yet), so RoundPipe and the GradScaler go on in the child exactly as they would
  have in the parent. A child forked while jobs were queued or running cannot have their
  results: its first launch, or any wait that covers them, raises ``RuntimeError`` at
  once, never hangs. A child that never touches the stream (a DataLoader worker) is
  unaffected either way.
* **Exit.** At interpreter exit the main thread waits for queued work. A job failure
  nobody waited for is printed and the process exits with status 1; a wait at exit that
  takes long, or follows a Ctrl-C, says which job it waits for, and a Ctrl-C during it
  exits with status 130 after printing the optimizer thread's stack.
* **Inline calls.** :func:`call` runs a function as the next job and waits for it. When
  nothing is queued or running and no failure is waiting to be delivered, the calling thread
  runs it itself (no hop to the worker and back): it still takes the next sequence number,
  counts as waited for, is recorded if it raises, and sees :func:`on_optim_stream` and
  :func:`current_job` as a queued job would; the worker starts no other job meanwhile.
  Otherwise the call is queued and waited for. Either way the order of work is the same.
  Ctrl-C during an inline call interrupts the work itself, as in a plain loop (the
  traceback shows where), and the call counts as failed.
* **CUDA.** When CUDA is initialised at launch, the job is ordered after the launching
  thread's current stream with an event and runs on a dedicated optimizer stream of that
  device; a waiter's current stream then waits for the job's completion event. No host-side
  device synchronisation is added. An inline call does the same on the calling thread:
  it enters the optimizer stream, ordered by the same two events.
"""

from __future__ import annotations

import atexit
import bisect
import os
import queue
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import torch

__all__ = [
    "Job",
    "launch",
    "call",
    "wait",
    "synchronize",
    "on_optim_stream",
    "current_job",
    "launched_seq",
    "waited_seq",
    "faulted_between",
    "add_launch_hook",
    "cuda_stream",
]

THREAD_NAME = "roundpipe-optimizer"
_POLL_SECONDS = 0.1


class _CudaOrdering:
    """Events that order one job against the launching stream (CUDA only)."""

    def __init__(self) -> None:
        self.device = torch.cuda.current_device()
        self.ready = torch.cuda.Event()
        self.ready.record(torch.cuda.current_stream(self.device))
        self.done: Optional[torch.cuda.Event] = None


class Job:
    """One queued call. Created by :func:`launch`; wait for it with :meth:`wait`."""

    def __init__(self, seq: int, fn: Callable[..., Any], args: tuple, kwargs: dict, inline: bool = False) -> None:
        self.seq = seq
        self.inline = inline  # run by the caller of ``call`` on its own thread (the stream was idle)
        self.fn = fn
        self.args = args
        self.kwargs = kwargs
        self.result: Any = None
        self.cancelled = False
        self.raised = False
        self.cuda: Optional[_CudaOrdering] = None

    @property
    def failed(self) -> bool:
        """True once the job raised or was cancelled (read it after waiting for the job)."""
        return self.raised or self.cancelled

    @property
    def name(self) -> str:
        """A readable name of the queued callable, for messages."""
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)

    def wait(self, reason: Optional[str] = None) -> Any:
        """Wait for this job (and every earlier one); return its result.

        Raises the kept exception if this or an earlier job failed (see module docs).
        """
        _stream().wait(self.seq, reason or f"job {self.seq} ({self.name})")
        return self.result

    def __repr__(self) -> str:
        return f"<roundpipe optimizer job {self.seq}: {self.name}>"


class _OptimizerStream:
    """The singleton behind the module functions (one per process).

    ``parent`` is the stream of the process this one was forked from: its numbering,
    watermark, fault record and undelivered error carry over; jobs it had not finished are
    lost (see the module's fork contract). The worker thread starts at the first launch.
    """

    def __init__(self, parent: Optional["_OptimizerStream"] = None) -> None:
        # The lock of ``_cond``, entered directly on the inline-call path (a C-level context
        # manager, cheaper than the Condition's Python one); waits and notifies use ``_cond``.
        self._mutex = threading.RLock()
        self._cond = threading.Condition(self._mutex)
        self._sleepers = 0  # threads in a wait on ``_cond`` (see _sleep): a notify wakes them
        self._queue: "queue.SimpleQueue[Job]" = queue.SimpleQueue()
        self._launched = 0
        self._completed = 0
        self._waited = 0
        self._failure: Optional[Tuple[Job, BaseException]] = None
        self._cancel_through = 0
        self._faulted: List[int] = []
        self._lost: Optional[str] = None
        if parent is not None:
            self._inherit(parent)
        self._pending_cuda: Dict[int, Job] = {}
        self._running: Optional[Job] = None
        self._local = threading.local()
        self._cuda_streams: Dict[int, "torch.cuda.Stream"] = {}
        self._thread: Optional[threading.Thread] = None

    def _inherit(self, parent: "_OptimizerStream") -> None:
        """Take over ``parent``'s bookkeeping in a forked child (no lock: the parent's
        worker may have held it at the fork, and the child has one thread)."""
        self._launched = parent._launched
        self._completed = parent._completed
        self._waited = parent._waited
        self._failure = parent._failure
        self._cancel_through = parent._cancel_through
        self._faulted = list(parent._faulted)
        if parent._completed < parent._launched:
            running = parent._running
            doing = f"running {running!r}" if running is not None else "about to run queued jobs"
            self._lost = (
                f"this process (pid {os.getpid()}) was forked while the parent's "
                f"{THREAD_NAME} thread was {doing}: optimizer jobs "
                f"{parent._completed + 1}..{parent._launched} never finish here, so the "
                "model's and the scaler's optimizer state is incomplete. Fork only while "
                "the optimizer is idle (call model.synchronize() first), or use the "
                "'spawn' or 'forkserver' start method."
            )

    # ---- worker side -------------------------------------------------------------------
    def _serve(self) -> None:
        self._local.is_worker = True
        while True:
            job = self._queue.get()
            with self._cond:
                while self._running is not None:
                    # An inline call (see call()) holds the stream; it notifies when done.
                    self._sleep()
                cancel = self._failure is not None or job.seq <= self._cancel_through
                if cancel:
                    job.cancelled = True
                    self._faulted.append(job.seq)
                else:
                    self._running = job
            if not cancel:
                self._run(job)
            with self._cond:
                self._running = None
                self._completed = job.seq
                self._cond.notify_all()
            # Not kept while idle: the finished job's callable, arguments and result (a
            # step's released gradient buffers) belong to whoever holds the job, if anyone.
            del job

    def _run(self, job: Job) -> None:
        try:
            if job.cuda is None:
                job.result = job.fn(*job.args, **job.kwargs)
            else:
                job.result = self._run_on_cuda_stream(job, job.cuda)
        except BaseException as exc:  # noqa: BLE001 - every failure must reach a waiter
            with self._cond:
                job.raised = True
                self._faulted.append(job.seq)
                if self._failure is None:
                    self._failure = (job, exc)

    def cuda_stream(self, device: int) -> "torch.cuda.Stream":
        with self._cond:
            stream = self._cuda_streams.get(device)
            if stream is None:
                stream = torch.cuda.Stream(device=device)
                self._cuda_streams[device] = stream
            return stream

    def _run_on_cuda_stream(self, job: Job, ordering: _CudaOrdering) -> Any:
        stream = self.cuda_stream(ordering.device)
        with torch.cuda.device(ordering.device), torch.cuda.stream(stream):
            stream.wait_event(ordering.ready)
            try:
                return job.fn(*job.args, **job.kwargs)
            finally:
                done = torch.cuda.Event()
                done.record(stream)
                ordering.done = done

    # ---- caller side -------------------------------------------------------------------
    def is_worker(self) -> bool:
        """True on the optimizer thread, and on a thread while it runs an inline call."""
        return getattr(self._local, "is_worker", False)

    def _check_launcher(self, fn: Callable[..., Any]) -> None:
        if not callable(fn):
            raise TypeError(f"optimizer job must be callable, got {type(fn).__name__}")
        if self.is_worker():
            raise RuntimeError(
                "cannot launch optimizer-stream work from the optimizer thread itself; "
                "call the function directly instead"
            )
        if self._lost is not None:
            raise RuntimeError(f"cannot launch optimizer work: {self._lost}")

    def launch(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Job:
        self._check_launcher(fn)
        _run_launch_hooks()
        return self._enqueue(fn, args, kwargs)

    def _enqueue(self, fn: Callable[..., Any], args: tuple, kwargs: dict) -> Job:
        cuda = _CudaOrdering() if _cuda_in_use() else None
        with self._cond:
            self._launched += 1
            job = Job(self._launched, fn, args, kwargs)
            job.cuda = cuda
            if cuda is not None:
                self._pending_cuda[job.seq] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=THREAD_NAME, daemon=True)
                self._thread.start()
            self._queue.put(job)
        return job

    def call(self, fn: Callable[..., Any], args: tuple, reason: str) -> Any:
        """Run ``fn(*args)`` as the next job and wait for it: inline when the stream is idle."""
        self._check_launcher(fn)
        _run_launch_hooks()
        with self._mutex:
            idle = self._running is None and self._completed == self._launched and self._failure is None
            if idle:
                self._launched += 1
                job = Job(self._launched, fn, args, {}, inline=True)
                self._running = job
        if not idle:
            return self._enqueue(fn, args, {}).wait(reason)
        return self._run_inline(job)

    def _run_inline(self, job: Job) -> Any:
        """Run the claimed ``job`` on this thread as if it were the optimizer thread."""
        cuda = _CudaOrdering() if _cuda_in_use() else None
        local = self._local
        local.is_worker = True
        try:
            if cuda is None:
                return job.fn(*job.args)
            return self._run_on_cuda_stream(job, cuda)
        except BaseException:
            with self._mutex:
                self._faulted.append(job.seq)
                # Delivered at once (raised here): cancel what others launched meanwhile,
                # as a wait delivering a queued job's failure would.
                self._cancel_through = self._launched
            raise
        finally:
            local.is_worker = False
            with self._mutex:
                self._running = None
                self._completed = job.seq
                self._waited = max(self._waited, job.seq)
                if self._sleepers:
                    self._cond.notify_all()
            if cuda is not None and cuda.done is not None:
                torch.cuda.current_stream(cuda.device).wait_event(cuda.done)

    def wait(self, seq: int, reason: str) -> None:
        if self.is_worker():
            raise RuntimeError(
                f"cannot wait for the optimizer stream ({reason}) from the optimizer thread: it would wait for itself"
            )
        if self._lost is not None and seq > self._completed:
            raise RuntimeError(f"cannot wait for {reason}: {self._lost}")
        try:
            with self._cond:
                while self._completed < seq:
                    self._sleep(_POLL_SECONDS)
                    if self._completed < seq and not self._worker_alive():
                        raise RuntimeError(f"the optimizer thread has died while waiting for {reason}")
                self._waited = max(self._waited, seq)
                failure = self._failure
                if failure is not None and failure[0].seq <= seq:
                    self._failure = None
                    self._cancel_through = self._launched
                else:
                    failure = None
                done_event = self._take_cuda_event(seq)
        except KeyboardInterrupt as interrupt:
            _add_note(interrupt, self._describe_worker(reason))
            raise
        if done_event is not None:
            torch.cuda.current_stream(done_event[0]).wait_event(done_event[1])
        if failure is not None:
            job, exc = failure
            _add_note(
                exc,
                f"(raised on the {THREAD_NAME} thread in optimizer job {job.seq}: "
                f"{job.name}; re-raised while waiting for {reason})",
            )
            raise exc

    def _worker_alive(self) -> bool:
        """Someone can still complete launched jobs: the optimizer thread, or a caller
        running a job inline (before the first launch there is no thread yet)."""
        running = self._running
        inline = running is not None and running.inline
        return inline or (self._thread is not None and self._thread.is_alive())

    def _take_cuda_event(self, seq: int) -> Optional[Tuple[int, "torch.cuda.Event"]]:
        """Forget CUDA bookkeeping up to ``seq``; return the newest done event (lock held)."""
        newest: Optional[Tuple[int, int, "torch.cuda.Event"]] = None  # (job seq, device, done event)
        for job_seq in [s for s in self._pending_cuda if s <= seq]:
            job = self._pending_cuda.pop(job_seq)
            if job.cuda is not None and job.cuda.done is not None:
                if newest is None or job_seq > newest[0]:
                    newest = (job_seq, job.cuda.device, job.cuda.done)
        if newest is None:
            return None
        return newest[1], newest[2]

    def _describe_worker(self, reason: str) -> str:
        running = self._running
        ident = self._thread.ident if self._thread is not None else None
        frame = sys._current_frames().get(ident or -1)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(no frame)\n"
        doing = f"running {running!r}" if running is not None else "idle"
        return f"Interrupted while waiting for {reason}. The {THREAD_NAME} thread is {doing}; its stack:\n{where}"

    def lost_in_fork(self) -> bool:
        return self._lost is not None

    def finished_within(self, seq: int, seconds: float) -> bool:
        """Whether job ``seq`` finishes within ``seconds`` (does not deliver errors)."""
        with self._cond:
            self._sleepers += 1
            try:
                finished = self._cond.wait_for(lambda: self._completed >= seq or not self._worker_alive(), seconds)
            finally:
                self._sleepers -= 1
            return finished and self._completed >= seq

    def _sleep(self, timeout: Optional[float] = None) -> None:
        """Wait on ``_cond`` (its lock held), counted in ``_sleepers``, so that the end of
        an inline call, which happens on every idle-stream ``call``, notifies only when
        a thread is waiting (no wake-up is lost: both sides hold the lock)."""
        self._sleepers += 1
        try:
            self._cond.wait(timeout)
        finally:
            self._sleepers -= 1

    def describe_unfinished(self) -> str:
        with self._cond:
            running, left = self._running, self._launched - self._completed
        doing = f"{running!r}" if running is not None else "the optimizer thread"
        return f"{doing} ({left} optimizer job(s) not finished)"

    def launched_seq(self) -> int:
        return self._launched

    def waited_seq(self) -> int:
        return self._waited

    def faulted_between(self, low: int, high: int) -> bool:
        with self._cond:
            index = bisect.bisect_right(self._faulted, low)
            return index < len(self._faulted) and self._faulted[index] <= high


def _cuda_in_use() -> bool:
    # Initialised implies available; is_available() costs microseconds on every job.
    return torch.cuda.is_initialized()


def _add_note(exc: BaseException, note: str) -> None:
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python < 3.11: no notes; say it on stderr instead.
        print(note, file=sys.stderr)


_STREAM: Optional[_OptimizerStream] = None
_STREAM_LOCK = threading.Lock()
# Replaced, never mutated: a launch reads it without the lock.
# Each hook is (a weak reference to its owner, the function to call with the owner): a
# launch calls it without the Python-level call a WeakMethod would add.
_LAUNCH_HOOKS: Tuple[Tuple["weakref.ref[Any]", Callable[[Any], None]], ...] = ()


def _run_launch_hooks() -> None:
    dead = False
    for owner_ref, hook in _LAUNCH_HOOKS:
        owner = owner_ref()
        if owner is None:
            dead = True
        else:
            hook(owner)
    if dead:
        _prune_launch_hooks()


def _prune_launch_hooks() -> None:
    global _LAUNCH_HOOKS
    with _STREAM_LOCK:
        _LAUNCH_HOOKS = tuple(entry for entry in _LAUNCH_HOOKS if entry[0]() is not None)


def _stream() -> _OptimizerStream:
    global _STREAM
    stream = _STREAM
    if stream is None:
        with _STREAM_LOCK:
            if _STREAM is None:
                _STREAM = _OptimizerStream()
            stream = _STREAM
    return stream


def _renew_stream_in_child() -> None:
    """A forked child has no worker thread: give it a stream that carries on the parent's
    numbering (see the fork contract). Locks another thread may have held are replaced."""
    global _STREAM, _STREAM_LOCK
    _STREAM_LOCK = threading.Lock()
    if _STREAM is not None:
        _STREAM = _OptimizerStream(parent=_STREAM)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_stream_in_child)

_EXIT_PATIENCE_SECONDS = 2.0


def _exiting_on_interrupt() -> bool:
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return isinstance(last, KeyboardInterrupt)


def _leave(status: int) -> None:
    """End the process with ``status`` from an exit handler (which cannot set it otherwise)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not hide the status
            pass
    os._exit(status)


def _drain_at_exit() -> None:
    """Let queued optimizer work finish before the interpreter tears down.

    A daemon thread killed inside a torch kernel at shutdown aborts the process, so the
    queue is drained. An error nobody waited for is printed and the exit status becomes 1
    (``os._exit``: exit handlers registered before roundpipe was imported do not run then).
    A drain that outlasts a short patience, or follows a Ctrl-C, says which job it waits
    for; a Ctrl-C during it prints the optimizer thread's stack and exits with 130.
    """
    stream = _STREAM
    if stream is None or stream.is_worker() or stream.lost_in_fork():
        return
    seq = stream.launched_seq()
    patience = 0.0 if _exiting_on_interrupt() else _EXIT_PATIENCE_SECONDS
    reason = f"optimizer job {seq}, the last one queued, at interpreter exit"
    try:
        if not stream.finished_within(seq, patience):
            print(
                f"roundpipe: waiting for {stream.describe_unfinished()} to finish before "
                "exiting; press Ctrl-C to stop waiting",
                file=sys.stderr,
            )
        stream.wait(seq, reason)
    except KeyboardInterrupt as interrupt:
        notes = getattr(interrupt, "__notes__", None) or [stream._describe_worker(reason)]
        print("\n".join(notes), file=sys.stderr)
        print("roundpipe: interrupted at exit; the unfinished optimizer work was abandoned", file=sys.stderr)
        _leave(130)
    except BaseException:  # noqa: BLE001 - report, never raise during shutdown
        print("roundpipe: optimizer work failed and nobody waited for it:", file=sys.stderr)
        traceback.print_exc()
        _leave(1)


atexit.register(_drain_at_exit)


def launch(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Job:
    """Queue ``fn(*args, **kwargs)`` on the optimizer thread and return its :class:`Job`.

    Must be called from a thread other than the optimizer thread. Returns at once.
    """
    return _stream().launch(fn, args, kwargs)


def call(fn: Callable[..., Any], *args: Any, reason: Optional[str] = None) -> Any:
    """Run ``fn(*args)`` as the next optimizer job, wait for it and return its result.

    When no job is queued or running and no failure awaits delivery, the calling thread runs
    it itself, with the same ordering, bookkeeping and CUDA stream as the optimizer thread
    (see the module docs); an exception it raises propagates directly. Otherwise it is
    launched and waited for, as ``launch(fn, *args).wait(reason)``. Must be called from a
    thread other than the optimizer thread; launch hooks run first either way.
    """
    stream = _STREAM if _STREAM is not None else _stream()
    return stream.call(fn, args, reason or f"{getattr(fn, '__qualname__', fn)!s}")


def wait(target: Union[Job, int, None] = None, reason: Optional[str] = None) -> None:
    """Wait for a job (or job sequence number; default: all launched work).

    Raises the kept exception of the first failed job the wait covers. ``reason`` says what
    the caller is waiting for; it is shown if the wait is interrupted.
    """
    stream = _stream()
    if target is None:
        seq = stream.launched_seq()
    elif isinstance(target, Job):
        seq = target.seq
    else:
        seq = int(target)
    stream.wait(seq, reason or ("all optimizer work" if target is None else f"job {seq}"))


def synchronize(reason: Optional[str] = None) -> None:
    """Wait for every job launched so far (see :func:`wait`)."""
    wait(None, reason)


def on_optim_stream() -> bool:
    """True when called inside a running optimizer job (on the optimizer thread, or on the
    thread running an inline :func:`call`)."""
    stream = _STREAM  # no job running anywhere: not in one (no thread-local lookup)
    return stream is not None and stream._running is not None and stream.is_worker()


def current_job() -> Optional[Job]:
    """The job running on the calling thread, or None off the optimizer thread."""
    stream = _STREAM  # read once: these three run several times per training iteration
    if stream is None:
        return None
    running = stream._running
    if running is None:  # no job anywhere: not in one
        return None
    return running if stream.is_worker() else None


def launched_seq() -> int:
    """Sequence number of the newest launched job (0 before any launch)."""
    stream = _STREAM
    return stream._launched if stream is not None else 0


def waited_seq() -> int:
    """Highest sequence number any waiter has waited for (the waited watermark)."""
    stream = _STREAM
    return stream._waited if stream is not None else 0


def faulted_between(low: int, high: int) -> bool:
    """True if a job with ``low < seq <= high`` raised or was cancelled."""
    return _STREAM is not None and _STREAM.faulted_between(low, high)


def add_launch_hook(owner: Any, hook: Callable[[Any], None]) -> None:
    """Call ``hook(owner)`` on the launching thread before each :func:`launch` and
    :func:`call`, while ``owner`` lives.

    ``owner`` is held by weak reference (it may be garbage collected; its hook then stops).
    An exception from a hook propagates to the launcher and nothing is queued. The
    GradScaler uses this to settle a deferred scale update before optimizer work that will
    need the new scale is queued.
    """
    global _LAUNCH_HOOKS
    with _STREAM_LOCK:
        _LAUNCH_HOOKS = _LAUNCH_HOOKS + ((weakref.ref(owner), hook),)


def cuda_stream(device: Union[int, torch.device]) -> "torch.cuda.Stream":
    """The CUDA stream optimizer jobs use on ``device`` (created on first use).

    Tensors made on another stream and handed to optimizer jobs, which may free them, should
    be marked with ``tensor.record_stream(cuda_stream(device))``.
    """
    index = device.index if isinstance(device, torch.device) else device
    if index is None:
        index = torch.cuda.current_device()
    return _stream().cuda_stream(index)
