"""A task a user thread wrote straight to a leased worker, against the lease's idle timer
(a module of its own: it needs a cluster with a short idle timeout)."""

from __future__ import annotations

import os
import time

import pytest

import lumos
from lumos._private import worker_context

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
