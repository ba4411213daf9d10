"""SIGINT and cancel() in a worker: every task's reply goes out, whatever interrupts it.

A KeyboardInterrupt the task raises itself (it fails as a TaskCancelledError, as in Ray), a SIGINT someone sends the worker, a cancel
whose signal lands after its task ended, and a cancel that races the task's start must
each end in an answer to the owner (a value, a ``TaskError`` or ``TaskCancelledError``),
never in a reply that is lost and a ``get`` that waits forever."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest

import lumos
from lumos._private import interrupts
from lumos.exceptions import TaskCancelledError, TaskError
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(180)


@lumos.remote
def pid() -> int:
    return os.getpid()


@lumos.remote
def raises_interrupt() -> None:
    raise KeyboardInterrupt


@lumos.remote
def sleep_marked(path: str, seconds: float) -> str:
    Path(path).write_text(str(os.getpid()))
    time.sleep(seconds)
    return "slept"


@lumos.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def pid(self) -> int:
        return os.getpid()

    def slow(self, path: str) -> str:
        Path(path).write_text("in")
        time.sleep(30)
        return "slept"

    def incr(self) -> int:
        self.n += 1
        return self.n


def _wait_file(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.01)
    return path.read_text()


def test_a_task_that_raises_keyboard_interrupt_fails_and_its_worker_goes_on(fresh_cluster, tmp_path: Path) -> None:
    fresh_cluster(num_cpus=1)
    before = lumos.get(pid.remote(), timeout=30)
    with pytest.raises(TaskError) as info:
        lumos.get(raises_interrupt.remote(), timeout=20)
    assert "KeyboardInterrupt" in str(info.value)
    # As in Ray: a TaskCancelledError, never a KeyboardInterrupt in the driver (where an
    # `except KeyboardInterrupt` guard, or the notebook, would take it for the user's Ctrl-C).
    assert isinstance(info.value, TaskCancelledError) and not isinstance(info.value, KeyboardInterrupt)
    tries = tmp_path / "tries"

    @lumos.remote(max_retries=3, retry_exceptions=True)
    def counted() -> None:
        with open(tries, "a") as f:
            f.write("x")
        raise KeyboardInterrupt

    with pytest.raises(TaskCancelledError):  # and not retried, whatever retry_exceptions says
        lumos.get(counted.remote(), timeout=20)
    assert tries.read_text() == "x"
    assert lumos.get(pid.remote(), timeout=20) == before  # the same worker, still serving


def test_sigint_sent_to_a_worker_fails_its_running_task_with_an_answer(fresh_cluster, tmp_path: Path) -> None:
    fresh_cluster(num_cpus=1)
    marker = tmp_path / "pid"
    ref = sleep_marked.remote(str(marker), 30)
    worker = int(_wait_file(marker))
    t0 = time.monotonic()
    os.kill(worker, signal.SIGINT)
    with pytest.raises(TaskError) as info:
        lumos.get(ref, timeout=20)
    assert time.monotonic() - t0 < 10
    assert "KeyboardInterrupt" in str(info.value)
    assert lumos.get(pid.remote(), timeout=20) == worker
    # A SIGINT between tasks interrupts nothing: the next task runs to its end.
    os.kill(worker, signal.SIGINT)
    time.sleep(0.2)
    assert lumos.get(sleep_marked.remote(str(tmp_path / "again"), 0.3), timeout=20) == "slept"


def test_sigint_sent_to_a_sync_actor_fails_that_call_only(fresh_cluster, tmp_path: Path) -> None:
    fresh_cluster(num_cpus=1)
    actor = Counter.remote()
    assert lumos.get(actor.incr.remote(), timeout=30) == 1
    worker = lumos.get(actor.pid.remote(), timeout=20)
    marker = tmp_path / "in"
    ref = actor.slow.remote(str(marker))
    _wait_file(marker)
    os.kill(worker, signal.SIGINT)
    with pytest.raises(TaskError) as info:
        lumos.get(ref, timeout=20)
    assert "KeyboardInterrupt" in str(info.value)
    assert lumos.get(actor.incr.remote(), timeout=20) == 2  # its state kept, the actor alive


def test_a_cancel_signal_meant_for_an_ended_task_does_not_interrupt_the_next(fresh_cluster) -> None:
    """The window the stress test below can only hit by chance, made certain: cancel()
    sent SIGINT for a task that ended before the signal was handled, and the handler runs
    while the next task runs."""
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def signalled_for_another() -> str:
        import threading

        from lumos._private import worker_context
        ex = worker_context.require().executor
        ex._signalled = bytes(len(ex._running.task_id))  # as cancel() leaves it for an ended task
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
        time.sleep(0.3)
        return "ran to its end"

    assert lumos.get(signalled_for_another.remote(), timeout=20) == "ran to its end"
    assert lumos.get(pid.remote(), timeout=20) > 0


def test_cancels_racing_task_starts_and_ends_all_get_answers(fresh_cluster) -> None:
    """Cancels land at random moments around short tasks: before they start, as they
    start, while they run, just after they end (so the signal meant for one reaches the
    main thread while the next runs). Each get answers, and none is interrupted by a
    cancel meant for another task."""
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def short(i: int) -> int:
        time.sleep(0.002)
        return i

    rng = random.Random(7)
    refs = [short.remote(i) for i in range(300)]
    cancelled = set()
    for i, ref in enumerate(refs):
        if rng.random() < 0.5:
            time.sleep(rng.random() * 0.004)
            lumos.cancel(ref)
            cancelled.add(i)
    for i, ref in enumerate(refs):
        try:
            assert lumos.get(ref, timeout=30) == i
        except TaskCancelledError:
            assert i in cancelled, f"task {i} was never cancelled but was interrupted"


def test_a_cancel_as_a_long_task_starts_is_never_lost(fresh_cluster) -> None:
    """A cancel that comes while the worker is starting the task (between its
    cancelled-before-start check and marking it running) still cancels it."""
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def long(i: int) -> int:
        time.sleep(60)
        return i

    lumos.get(pid.remote(), timeout=30)  # a warm worker
    rng = random.Random(11)
    for i in range(40):
        ref = long.remote(i)
        time.sleep(rng.random() * 0.003)
        lumos.cancel(ref)
        t0 = time.monotonic()
        with pytest.raises(TaskCancelledError):
            lumos.get(ref, timeout=20)
        assert time.monotonic() - t0 < 10


@lumos.remote
def slow_in_lumos_part(where: str, marker: str) -> int:
    """Make this worker's own part around its next task slow (``where``: ``"start"``, as
    it records the task running; ``"end"``, as it packs the error of a task that raised),
    and write ``marker`` when it gets there: a cancel's SIGINT then lands there for
    certain."""
    from lumos._private import worker_context
    cw = worker_context.require()
    target, name = (cw, "record_running") if where == "start" else (cw.executor, "_error_returns")
    original = getattr(target, name)

    def slow(*args: object, **kwargs: object) -> object:
        setattr(target, name, original)  # (once)
        Path(marker).write_text(str(os.getpid()))
        time.sleep(0.5)
        return original(*args, **kwargs)

    setattr(target, name, slow)
    return os.getpid()


def test_a_cancel_landing_as_the_worker_sets_a_task_up_cancels_it(fresh_cluster, tmp_path: Path) -> None:
    """The window the stress test above hits by chance, made certain: the cancel's SIGINT
    lands after the task is marked running and before its own code starts (lumos's part:
    its task event, its GPUs). It used to escape the worker's ``execute``, and the reply
    was never sent."""
    fresh_cluster(num_cpus=1)

    @lumos.remote
    def long() -> int:
        time.sleep(60)
        return 0

    marker = tmp_path / "in"
    worker = lumos.get(slow_in_lumos_part.remote("start", str(marker)), timeout=30)
    ref = long.remote()
    assert _wait_file(marker) == str(worker)
    lumos.cancel(ref)
    t0 = time.monotonic()
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=20)
    assert time.monotonic() - t0 < 10
    assert lumos.get(pid.remote(), timeout=20) == worker  # the same worker goes on


def test_a_cancel_landing_as_the_worker_packs_a_tasks_error_is_moot(fresh_cluster, tmp_path: Path) -> None:
    """The cancel's SIGINT lands after the task's code ended (it raised), while the
    worker packs its error: the task is over, its error is the answer."""
    fresh_cluster(num_cpus=1)

    @lumos.remote(max_retries=0)
    def fails() -> None:
        raise ValueError("its own error")

    marker = tmp_path / "in"
    worker = lumos.get(slow_in_lumos_part.remote("end", str(marker)), timeout=30)
    ref = fails.remote()
    assert _wait_file(marker) == str(worker)
    lumos.cancel(ref)
    with pytest.raises(TaskError, match="its own error"):
        lumos.get(ref, timeout=20)
    assert lumos.get(pid.remote(), timeout=20) == worker


@lumos.remote(max_retries=0)
def puts_for_ever() -> None:
    import numpy as np
    value = np.ones((1 << 20) // 8)
    kept = []
    while True:
        kept.append(lumos.put(value))
        if len(kept) > 20:
            kept.clear()


def test_tasks_cancelled_at_random_moments_of_their_puts_leave_no_object_behind(fresh_cluster) -> None:
    """A cancel's SIGINT landing inside a task's put (a store slot taken, the object not
    yet sealed or counted) is raised once the put is whole: the task ends cancelled and
    its worker frees what it put. It used to leave the object to the worker for its life."""
    from lumos._private import worker_context
    from lumos._private.protocol import messages as m

    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)

    def objects_in_store() -> int:
        return int(worker_context.require().call_raylet(m.GetNodeStats())["store"]["num_objects"])

    lumos.get(pid.remote(), timeout=30)
    before = objects_in_store()
    rng = random.Random(3)
    for _ in range(20):
        ref = puts_for_ever.remote()
        time.sleep(0.05 + rng.random() * 0.05)
        lumos.cancel(ref)
        with pytest.raises(TaskCancelledError):
            lumos.get(ref, timeout=20)
    wait_for(lambda: objects_in_store() <= before, 10)


class _Stop(BaseException):
    """A user's own BaseException subclass."""


@lumos.remote
class AsyncRaiser:
    async def interrupt(self) -> None:
        raise KeyboardInterrupt

    async def ok(self) -> int:
        return 1


@lumos.remote(max_concurrency=4)
class ThreadedRaiser:
    def interrupt(self) -> None:
        raise KeyboardInterrupt

    def ok(self) -> int:
        return 1


def test_async_and_threaded_actors_answer_a_call_that_raised_keyboard_interrupt(fresh_cluster) -> None:
    """On an async actor a KeyboardInterrupt ended the event loop (that call and every
    later one went unanswered); on a threaded actor it lost that call's reply."""
    fresh_cluster(num_cpus=1)
    for actor in (AsyncRaiser.remote(), ThreadedRaiser.remote()):
        with pytest.raises(TaskError, match="KeyboardInterrupt"):
            lumos.get(actor.interrupt.remote(), timeout=20)
        assert lumos.get(actor.ok.remote(), timeout=20) == 1


def test_a_task_raising_a_base_exception_of_its_own_fails_with_it(fresh_cluster) -> None:
    fresh_cluster(num_cpus=1)

    @lumos.remote(max_retries=0)
    def stops() -> None:
        raise _Stop("a BaseException subclass")

    before = lumos.get(pid.remote(), timeout=30)
    with pytest.raises(TaskError, match="a BaseException subclass"):
        lumos.get(stops.remote(), timeout=20)
    assert lumos.get(pid.remote(), timeout=20) == before  # the worker goes on


class _SlowToGo:
    """A finalizer of lumos's stand-in: ``__del__`` takes 0.2 s, and notes in ``path``
    that it began and that it ended."""

    def __init__(self, path: str) -> None:
        self.path = path

    @interrupts.finalizer
    def __del__(self) -> None:
        with open(self.path, "a") as f:
            f.write("began\n")
        t = time.perf_counter() + 0.2
        while time.perf_counter() < t:
            pass
        with open(self.path, "a") as f:
            f.write("ended\n")


@lumos.remote
def drops_slow_finalizers(path: str, log: str) -> str:
    Path(path).write_text(str(os.getpid()))
    for _ in range(50):
        obj = _SlowToGo(log)
        del obj
        time.sleep(0.01)
    return "finished"


def test_a_cancel_landing_in_a_finalizer_cancels_the_task_once_it_ended(fresh_cluster, tmp_path: Path) -> None:
    """The cancel's SIGINT lands while one of lumos's finalizers runs in the task (Python
    would only print a KeyboardInterrupt raised there: the finalizer half done, the cancel
    lost and the task run to its end): the finalizer ends, then the task is cancelled."""
    fresh_cluster(num_cpus=1)
    marker, log = tmp_path / "pid", tmp_path / "finalizers"
    ref = drops_slow_finalizers.remote(str(marker), str(log))
    _wait_file(marker)
    time.sleep(0.1)  # (inside the first finalizer, ~0.1 s of its 0.2 left)
    t0 = time.monotonic()
    lumos.cancel(ref)
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=20)
    assert time.monotonic() - t0 < 5
    lines = log.read_text().split()
    assert lines and lines.count("began") == lines.count("ended"), lines
