"""Actor calls a user thread writes straight to the actor's connection (``send_direct``):
order, results, and failures in flight are as for calls the io thread sends."""

from __future__ import annotations

import os
import signal
import time

import pytest

import lumos
from lumos._private import worker_context
from lumos.exceptions import ActorDiedError

pytestmark = pytest.mark.timeout(120)


@lumos.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def incr(self) -> int:
        self.n += 1
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def slow_pid(self) -> int:
        time.sleep(1.0)
        return os.getpid()

    def sleep(self) -> None:
        time.sleep(60)


def _direct_sent() -> int:
    return worker_context.require().actor_submitter.direct_sent  # type: ignore[no-any-return]


def test_sync_calls_go_straight_to_the_actor_and_keep_their_order(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    assert lumos.get(c.incr.remote(), timeout=60) == 1
    before = _direct_sent()
    seen = []
    for i in range(300):
        if i % 50 == 0:  # a burst the io thread sends, between calls sent straight
            seen += lumos.get([c.incr.remote() for _ in range(20)], timeout=60)
        seen.append(lumos.get(c.incr.remote(), timeout=60))
    assert seen == list(range(2, 2 + len(seen)))
    assert _direct_sent() - before >= 150  # most sync calls skipped the io thread's turn
    rows = [t for t in lumos.state.list_tasks(limit=100_000) if t["name"] == "Counter.incr"]
    assert rows  # their task events still reach the GCS


def test_a_call_sent_straight_fails_when_its_actor_is_killed(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    lumos.get(c.pid.remote(), timeout=60)
    before = _direct_sent()
    ref = c.sleep.remote()
    assert _direct_sent() == before + 1
    time.sleep(0.3)
    lumos.kill(c)
    with pytest.raises(ActorDiedError):
        lumos.get(ref, timeout=30)


def test_a_call_sent_straight_is_retried_on_the_restarted_actor(cluster: lumos.LumosContext) -> None:
    c = Counter.options(max_restarts=1, max_task_retries=1).remote()
    first = lumos.get(c.pid.remote(), timeout=60)
    before = _direct_sent()
    ref = c.slow_pid.remote()
    assert _direct_sent() == before + 1
    time.sleep(0.3)
    os.kill(first, signal.SIGKILL)
    assert lumos.get(ref, timeout=60) != first
    assert lumos.get(c.incr.remote(), timeout=60) == 1  # the restarted instance
