"""A worker with more calls queued behind a short one holds the short one's reply back and
sends the replies of several calls in one write (``CoreWorker.send_reply``); a reply never
waits for a long call that follows it (``_watch_held``).

Observed from outside, as an operator would: the write system calls of the worker's
process (``/proc/<pid>/io``'s ``syscw``), and when the caller gets each value; the io
thread's watch over held replies in the driver's own core worker, whose ``send_reply``
is the workers'."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

import lumos
from lumos.exceptions import GetTimeoutError

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/io").is_file(), reason="reads /proc (Linux)")]


def _writes(pid: int) -> int:
    """Write system calls of process ``pid`` so far."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("syscw:"):
            return int(line.split()[1])
    raise AssertionError(f"no syscw for {pid}")


@lumos.remote
class Worker:
    def pid(self) -> int:
        return os.getpid()

    def block(self, s: float) -> str:
        time.sleep(s)
        return "blocked"

    def ping(self, i: int) -> int:
        return i


@lumos.remote
def pid_of_worker() -> int:
    return os.getpid()


@lumos.remote
def echo(i: int) -> int:
    return i


def test_queued_short_calls_share_their_reply_writes(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1)
    actor = Worker.remote()
    pid = lumos.get(actor.pid.remote(), timeout=60)
    before = _writes(pid)
    # The first call keeps the actor busy while the 200 after it queue up behind it.
    blocker = actor.block.remote(0.5)
    pings = [actor.ping.remote(i) for i in range(200)]
    assert lumos.get(pings, timeout=60) == list(range(200))
    assert lumos.get(blocker, timeout=60) == "blocked"
    writes = _writes(pid) - before
    # A reply per write made 201 writes and more (the task events' flushes besides); held
    # replies leave up to 17 in one write.
    assert writes < 100, writes


def test_a_burst_of_short_tasks_sends_several_replies_per_write(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1)
    pid = lumos.get(pid_of_worker.remote(), timeout=60)
    lumos.get([echo.remote(i) for i in range(50)], timeout=60)  # the owner learns they are short: it pipelines
    before = _writes(pid)
    n = 400
    assert lumos.get([echo.remote(i) for i in range(n)], timeout=60) == list(range(n))
    writes = _writes(pid) - before
    # The owner sends up to 8 tasks at once and more when half of them came back; the
    # worker sends 4 replies in a write while tasks wait in its queue. A reply per write made
    # at least one write per task (and the wake-ups of its io thread besides).
    assert writes < 0.8 * n, writes


@lumos.remote
class AsyncWorker:
    def pid(self) -> int:
        return os.getpid()

    async def hog(self, s: float) -> str:
        time.sleep(s)  # (keeps the actor's event loop busy, as a CPU-bound coroutine does)
        return "hogged"

    async def ping(self, i: int) -> int:
        return i

    def wakes(self) -> int:
        """How many times the main thread woke the event loop for calls."""
        from lumos._private import worker_context
        return worker_context.require().executor.actor.inbox_wakes


def test_an_async_actors_queued_calls_share_their_loop_wake_ups_and_reply_writes(fresh_cluster: Any) -> None:
    """An async actor's main thread hands the calls it dispatches to the event loop with
    one wake-up for all that wait (``ActorHost._take_calls``), and the replies of the
    calls that finish in one turn of the loop leave in one write (``_send_finished``).
    Each call cost a wake-up of the loop (a send on its self-pipe) and a reply write."""
    fresh_cluster(num_cpus=1)
    actor = AsyncWorker.remote()
    pid = lumos.get(actor.pid.remote(), timeout=60)
    lumos.get([actor.ping.remote(i) for i in range(20)], timeout=60)
    before, wakes = _writes(pid), lumos.get(actor.wakes.remote(), timeout=60)
    hog = actor.hog.remote(0.5)
    n = 300
    pings = [actor.ping.remote(i) for i in range(n)]  # they wait while the loop is busy
    assert lumos.get(hog, timeout=60) == "hogged"
    assert lumos.get(pings, timeout=60) == list(range(n))
    writes = _writes(pid) - before
    # A write per reply made 303 here (4 now: the replies leave together, as the
    # calls ran in one turn of the loop).
    assert writes < n // 10, writes
    # One wake-up for the calls that came while the loop was busy, a few for the rest.
    assert lumos.get(actor.wakes.remote(), timeout=60) - wakes < n // 10


def test_a_long_call_does_not_keep_the_reply_before_it(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1)
    actor = Worker.remote()
    lumos.get(actor.pid.remote(), timeout=60)
    first = actor.block.remote(0.3)
    quick = actor.ping.remote(7)  # runs with the long call queued behind it: its reply is held
    long = actor.block.remote(30)
    try:
        assert lumos.get(first, timeout=20) == "blocked"
        # Held until the long call's reply, it would come 30 s later.
        assert lumos.get(quick, timeout=5) == 7
        with pytest.raises(GetTimeoutError):
            lumos.get(long, timeout=0.1)
    finally:
        lumos.kill(actor)


def test_held_replies_around_a_failure_and_a_generator_all_arrive(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1)

    @lumos.remote
    class Mixed:
        def block(self, s: float) -> None:
            time.sleep(s)

        def ping(self, i: int) -> int:
            return i

        def fail(self) -> None:
            raise ValueError("failed on purpose")

        @lumos.method(num_returns="streaming")
        def stream(self, n: int) -> Any:
            yield from range(n)

    actor = Mixed.remote()
    lumos.get(actor.block.remote(0), timeout=60)
    blocker = actor.block.remote(0.3)
    before = [actor.ping.remote(i) for i in range(10)]
    failing = actor.fail.remote()
    gen = actor.stream.remote(5)
    after = [actor.ping.remote(i) for i in range(10, 20)]
    lumos.get(blocker, timeout=30)
    assert lumos.get(before, timeout=30) == list(range(10))
    with pytest.raises(ValueError, match="failed on purpose"):
        lumos.get(failing, timeout=30)
    assert [lumos.get(r, timeout=30) for r in gen] == list(range(5))
    assert lumos.get(after, timeout=30) == list(range(10, 20))


class _Recorder:
    """A connection that keeps what is written to it (``send_reply``'s three ways)."""

    def __init__(self) -> None:
        self.replies: list[Any] = []

    def write_now(self, msg: Any) -> bool:
        self.replies.append(msg)
        return True

    def write_all_now(self, msgs: list[Any]) -> bool:
        self.replies.extend(msgs)
        return True

    def notify(self, msg: Any) -> None:
        self.replies.append(msg)


def test_the_held_reply_watch_stays_armed_through_a_burst_of_groups(fresh_cluster: Any) -> None:
    """In a burst of short tasks the owner sends a few at a time: the worker holds a
    reply while the next runs, sends both when its queue runs dry, and waits a fraction of
    a millisecond for the next few. The io thread's watch over held replies stopped at
    each look that fell in such a wait (most of them), and the next group woke the io
    thread to start it again: a wake-up per group or two, ~1,000 a second on a busy
    worker. It stops now only at a look that found no group held since the one before."""
    fresh_cluster(num_cpus=1)
    from lumos._private import worker_context
    from lumos._private.protocol import messages as m
    cw = worker_context.require()  # the driver's core worker: its held-reply path is the workers'
    conn = _Recorder()
    starts = cw.held_watches
    groups = 300
    for i in range(groups):
        now = time.time()
        cw.send_reply(conn, m.TaskReply(b"h%d" % i, [], False, False, [], cw.worker_id, now, now), hold=4)
        now = time.time()  # the next call ran; its reply sends the held one (the queue ran dry)
        cw.send_reply(conn, m.TaskReply(b"s%d" % i, [], False, False, [], cw.worker_id, now, now))
        time.sleep(0.0004)  # the owner's next few calls are on their way
    # Every reply arrived once, each held one before the one that sent it.
    assert [r.task_id for r in conn.replies] == [t for i in range(groups) for t in (b"h%d" % i, b"s%d" % i)]
    # One start for the burst (a few more where this thread was off its core for a
    # millisecond); stopping at every look that found none held made one per group.
    assert cw.held_watches - starts <= 15, cw.held_watches - starts
    deadline = time.monotonic() + 5
    while cw._held_watched and time.monotonic() < deadline:  # and it stops after the burst
        time.sleep(0.01)
    assert not cw._held_watched
