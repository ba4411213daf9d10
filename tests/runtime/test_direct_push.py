"""Actor calls and tasks a user thread writes straight to the worker's connection
(``ActorSubmitter.send_direct``, ``CoreWorker.push_direct``): order, results, and failures
in flight are as for those the io thread sends."""

from __future__ import annotations

import os
import signal
import time

import pytest

import lumos
from lumos._private import worker_context
from lumos.exceptions import ActorDiedError, TaskCancelledError, WorkerCrashedError


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


@lumos.remote
def _where(marker: str = "", sleep_s: float = 0.0) -> int:
    if marker:
        if not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(1)  # the first attempt's worker dies mid-task
    time.sleep(sleep_s)
    return os.getpid()


def _direct_tasks() -> int:
    return worker_context.require().direct_tasks  # type: ignore[no-any-return]


def test_sync_tasks_go_straight_to_an_idle_leased_worker(cluster: lumos.LumosContext) -> None:
    lumos.get(_where.remote(), timeout=60)  # a lease for the shape, idle after it
    before = _direct_tasks()
    pids = [lumos.get(_where.remote(), timeout=60) for _ in range(50)]
    assert _direct_tasks() - before >= 25
    assert all(isinstance(p, int) for p in pids)
    bursts = lumos.get([_where.remote() for _ in range(100)], timeout=60)  # the io thread's path between
    assert len(bursts) == 100 and lumos.get(_where.remote(), timeout=60) in set(pids) | set(bursts)


def test_a_task_sent_straight_is_retried_when_its_worker_dies(cluster: lumos.LumosContext, tmp_path) -> None:
    lumos.get(_where.options(max_retries=1).remote(), timeout=60)
    before = _direct_tasks()
    marker = str(tmp_path / "died")
    ref = _where.options(max_retries=1).remote(marker)
    assert _direct_tasks() == before + 1
    assert isinstance(lumos.get(ref, timeout=60), int) and os.path.exists(marker)


def test_a_task_sent_straight_fails_when_its_worker_dies_and_no_retry_is_left(
        cluster: lumos.LumosContext, tmp_path) -> None:
    lumos.get(_where.options(max_retries=0).remote(), timeout=60)
    before = _direct_tasks()
    ref = _where.options(max_retries=0).remote(str(tmp_path / "died"))
    assert _direct_tasks() == before + 1
    with pytest.raises(WorkerCrashedError):
        lumos.get(ref, timeout=60)


def test_a_task_sent_straight_can_be_cancelled(cluster: lumos.LumosContext) -> None:
    lumos.get(_where.remote(), timeout=60)
    before = _direct_tasks()
    ref = _where.remote("", 30.0)
    assert _direct_tasks() == before + 1
    time.sleep(0.3)
    lumos.cancel(ref)
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=30)
