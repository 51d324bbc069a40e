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


def test_call_on_an_idle_stream_runs_on_the_calling_thread_as_the_next_job():
    optim_stream.synchronize()
    before = optim_stream.launched_seq()
    inside = optim_stream.call(
        lambda: (threading.current_thread(), optim_stream.on_optim_stream(), optim_stream.current_job().seq)
    )
    assert inside == (threading.current_thread(), True, before + 1)
    assert optim_stream.launched_seq() == optim_stream.waited_seq() == before + 1
    assert not optim_stream.on_optim_stream()


def test_call_behind_queued_work_is_queued_after_it():
    order = []
    gate = threading.Event()
    optim_stream.launch(lambda: (gate.wait(10), order.append("queued")))
    threading.Timer(0.05, gate.set).start()
    where = optim_stream.call(lambda: (order.append("call"), threading.current_thread().name)[1])
    assert order == ["queued", "call"]
    assert where == "roundpipe-optimizer"


def test_the_worker_starts_nothing_while_an_inline_call_runs():
    order = []

    def inline():
        launcher = threading.Thread(target=lambda: optim_stream.launch(order.append, "launched"))
        launcher.start()
        launcher.join(10)
        time.sleep(0.05)  # the worker has the job now; it must not start it yet
        order.append("inline done")

    optim_stream.call(inline)
    optim_stream.synchronize()
    assert order == ["inline done", "launched"]


def test_an_earlier_queued_failure_reaches_call_and_cancels_it():
    ran = []
    failing = optim_stream.launch(_failing_job)
    deadline = time.monotonic() + 10
    while not optim_stream.faulted_between(failing.seq - 1, failing.seq) and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)  # the worker is idle again, the failure not yet delivered
    with pytest.raises(KeyError):
        optim_stream.call(ran.append, "cancelled")
    assert ran == []
    assert optim_stream.call(lambda: 7) == 7


def test_an_inline_failure_is_raised_with_its_traceback_and_recorded_as_a_fault():
    optim_stream.synchronize()
    with pytest.raises(KeyError) as caught:
        optim_stream.call(_failing_job)
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert any(frame.name == "_failing_job" for frame in frames)
    seq = optim_stream.launched_seq()
    assert optim_stream.faulted_between(seq - 1, seq)
    assert optim_stream.waited_seq() == seq
    optim_stream.synchronize()  # delivered once: nothing left to raise
    assert optim_stream.call(lambda: 1) == 1


def test_inside_an_inline_call_waits_and_launches_are_refused_like_on_the_worker():
    def nested():
        with pytest.raises(RuntimeError, match="would wait for itself"):
            optim_stream.synchronize()
        with pytest.raises(RuntimeError, match="optimizer thread itself"):
            optim_stream.launch(lambda: None)
        return "ok"

    assert optim_stream.call(nested) == "ok"


def test_ctrl_c_during_an_inline_call_interrupts_it_and_counts_as_a_fault():
    optim_stream.synchronize()
    reached = []

    def interrupted():
        _thread.interrupt_main()
        for _ in range(500):  # the interrupt lands in here
            time.sleep(0.01)
        reached.append("end")

    with pytest.raises(KeyboardInterrupt):
        optim_stream.call(interrupted)
    seq = optim_stream.launched_seq()
    assert reached == [] and optim_stream.faulted_between(seq - 1, seq)
    assert not optim_stream.on_optim_stream()
    assert optim_stream.call(lambda: 3) == 3


def test_a_wait_during_another_threads_inline_call_before_any_launch_does_not_report_a_dead_thread():
    """The first job run inline by ``call`` (no optimizer thread exists yet): another
    thread's ``synchronize`` waits for it instead of reporting the thread as dead."""
    stream = optim_stream._OptimizerStream()
    started, errors = threading.Event(), []

    def slow():
        started.set()
        time.sleep(0.4)

    caller = threading.Thread(target=stream.call, args=(slow, (), "the inline job"))
    caller.start()
    assert started.wait(5)

    def waiter():
        try:
            stream.wait(1, "the other thread's inline job")
        except RuntimeError as exc:
            errors.append(exc)

    other = threading.Thread(target=waiter)
    other.start()
    other.join(5)
    caller.join(5)
    assert errors == []
    assert stream._thread is None  # no optimizer thread was ever needed
