"""A task a user thread wrote straight to a leased worker, against the lease's idle timer
(a module of its own: it needs a cluster with a short idle timeout)."""

from __future__ import annotations

import os
import time

import pytest

import lumos
from lumos._private import worker_context
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)


@lumos.remote
def _where(sleep_s: float = 0.0, log: str = "") -> int:
    if log:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
    time.sleep(sleep_s)
    return os.getpid()


def test_a_lease_idle_timer_firing_under_a_task_sent_straight_keeps_the_worker(fresh_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The idle timer set after the last reply fires while the task it did not see runs:
    the task is booked first, so the lease is not given back under it."""
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"lease_idle_timeout_ms": 50})
    cw = worker_context.require()
    first = lumos.get(_where.remote(), timeout=60)
    before = cw.direct_tasks
    log = str(tmp_path / "runs")
    ref = _where.remote(0.6, log)
    assert cw.direct_tasks == before + 1
    assert lumos.get(ref, timeout=60) == first
    with open(log) as f:
        assert f.read().split() == [str(first)]  # ran once, on the worker it was written to
    assert lumos.get(_where.remote(), timeout=60) > 0


def test_sync_calls_share_one_idle_timer_and_the_idle_worker_still_goes_back(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    """The lease's idle timer is neither cancelled by each task nor started anew after
    each reply: a run of sync calls arms about one timer per timeout that passes (not
    one per call), and the worker is still given back once it has idled that long."""
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"lease_idle_timeout_ms": 1000})
    cw = worker_context.require()
    lumos.get(_where.remote(), timeout=60)
    armed = cw.idle_timers_armed
    start = time.monotonic()
    for _ in range(40):
        lumos.get(_where.remote(), timeout=60)
    elapsed = time.monotonic() - start
    assert cw.idle_timers_armed - armed <= 2 + int(elapsed)  # (before: one per call, 40)
    queues = list(cw.submitter.state.queues.values())
    wait_for(lambda: not any(q.leases for q in queues), timeout_s=30)
    assert lumos.get(_where.remote(), timeout=60) > 0  # a new lease serves the next call
