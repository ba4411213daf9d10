"""A worker with more calls queued behind a short one holds the short one's reply back and
sends the replies of several calls in one write (``CoreWorker.send_reply``); a reply never
waits for a long call that follows it (``_watch_held``).

Observed from outside, as an operator would: the write system calls of the worker's
process (``/proc/<pid>/io``'s ``syscw``), and when the caller gets each value."""

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
