"""The optimizer thread: FIFO order, errors back on the main thread, no hangs."""

import _thread
import threading
import time
import traceback

import pytest

from roundpipe import optim_stream


def test_jobs_run_in_launch_order_on_one_named_thread():
    seen = []
    jobs = [optim_stream.launch(lambda i=i: seen.append((i, threading.current_thread().name))) for i in range(50)]
    jobs[-1].wait()
    assert [i for i, _ in seen] == list(range(50))
    assert {name for _, name in seen} == {"roundpipe-optimizer"}
    assert optim_stream.waited_seq() >= jobs[-1].seq


def test_on_optim_stream_tells_the_threads_apart():
    assert not optim_stream.on_optim_stream()
    assert optim_stream.launch(optim_stream.on_optim_stream).wait() is True


def _failing_job():
    raise KeyError("boom in a step function")


def test_an_exception_in_a_job_reaches_the_waiter_with_its_traceback():
    job = optim_stream.launch(_failing_job)
    with pytest.raises(KeyError) as caught:
        job.wait()
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert any(frame.name == "_failing_job" for frame in frames)
    assert any("roundpipe-optimizer" in note for note in getattr(caught.value, "__notes__", []))
    # The stream keeps serving after the error was delivered.
    assert optim_stream.launch(lambda: 42).wait() == 42


def test_jobs_queued_behind_a_failure_are_cancelled_and_the_error_is_raised_once():
    ran = []
    gate = threading.Event()
    optim_stream.launch(gate.wait, 10)
    optim_stream.launch(_failing_job)
    behind = optim_stream.launch(ran.append, "behind")
    gate.set()
    with pytest.raises(KeyError):
        behind.wait()
    assert ran == [] and behind.cancelled
    assert optim_stream.faulted_between(behind.seq - 2, behind.seq)
    optim_stream.synchronize()  # nothing left to raise
    after = optim_stream.launch(ran.append, "after")
    after.wait()
    assert ran == ["after"]


def test_waiting_from_the_optimizer_thread_is_refused_not_a_deadlock():
    def waits_on_itself():
        optim_stream.synchronize()

    with pytest.raises(RuntimeError, match="from the optimizer thread"):
        optim_stream.launch(waits_on_itself).wait()


def test_ctrl_c_while_waiting_shows_where_the_optimizer_thread_is():
    gate = threading.Event()

    def stuck_in_optimizer_step():
        gate.wait(10)

    job = optim_stream.launch(stuck_in_optimizer_step)
    threading.Timer(0.3, _thread.interrupt_main).start()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            job.wait("the test's step")
    finally:
        gate.set()
        job.wait()
    note = "\n".join(caught.value.__notes__)
    assert "the test's step" in note and "stuck_in_optimizer_step" in note


def test_launch_rejects_non_callables():
    with pytest.raises(TypeError, match="callable"):
        optim_stream.launch(3)


def test_the_waited_watermark_moves_only_when_someone_waits():
    gate = threading.Event()
    job = optim_stream.launch(gate.wait, 10)
    before = optim_stream.waited_seq()
    gate.set()
    time.sleep(0.05)
    assert optim_stream.waited_seq() == before < job.seq
    job.wait()
    assert optim_stream.waited_seq() == job.seq
