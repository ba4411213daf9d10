"""``WorkerPoolState``: how workers start, back off and refill (no processes)."""

from __future__ import annotations

import pytest

from lumos._private.raylet import worker_pool as wp


def test_workers_are_forked_while_the_fork_server_starts_or_runs() -> None:
    s = wp.WorkerPoolState(wp.FORK, validate=True)
    # Requests sent before it is ready wait in its pipe.
    assert s.handle(wp.StartRequested(), now=0) == [wp.StartWorker(wp.FORK)]
    s.handle(wp.ForkServerReady(), now=1)
    assert s.handle(wp.StartRequested(), now=1) == [wp.StartWorker(wp.FORK)]


def test_spawn_method_never_forks() -> None:
    s = wp.WorkerPoolState(wp.SPAWN, validate=True)
    assert s.handle(wp.StartRequested(), now=0) == [wp.StartWorker(wp.SPAWN)]
    assert s.handle(wp.ForkServerDied(), now=0) == []  # there is none to restart


def test_dead_fork_server_means_spawn_until_it_is_restarted() -> None:
    s = wp.WorkerPoolState(wp.FORK, validate=True)
    s.handle(wp.ForkServerReady(), now=0)
    assert s.handle(wp.ForkServerDied(), now=1) == [wp.StartForkServer(0.5)]
    assert s.handle(wp.StartRequested(), now=1) == [wp.StartWorker(wp.SPAWN)]
    s.handle(wp.ForkServerRestartDue(), now=1.5)
    assert s.handle(wp.StartRequested(), now=1.5) == [wp.StartWorker(wp.FORK)]


def test_fork_server_that_keeps_dying_is_restarted_less_often() -> None:
    s = wp.WorkerPoolState(wp.FORK, validate=True)
    delays = []
    now = 0.0
    for _ in range(8):
        (action,) = s.handle(wp.ForkServerDied(), now)
        assert isinstance(action, wp.StartForkServer)
        delays.append(action.delay_s)
        now += action.delay_s
        s.handle(wp.ForkServerRestartDue(), now)
    assert delays == sorted(delays) and delays[0] == 0.5
    assert delays[-1] == wp.FORK_SERVER_MAX_BACKOFF_S
    # Once one stays up a while, the backoff starts over.
    s.handle(wp.ForkServerReady(), now)
    assert s.handle(wp.ForkServerDied(), now + wp.FORK_SERVER_HEALTHY_S) == [wp.StartForkServer(0.5)]


def test_workers_dying_before_registering_back_off_starts() -> None:
    s = wp.WorkerPoolState(wp.SPAWN, validate=True)
    actions = s.handle(wp.WorkerExited(registered=False, killed=False, code=1), now=10)
    assert actions == [wp.ReportStartFailures(1, 0.2)]
    # Within the backoff: one deferred start, then nothing more until it fires.
    assert s.handle(wp.StartRequested(), now=10.1) == [wp.DeferStart(pytest.approx(0.1))]
    assert s.handle(wp.StartRequested(), now=10.1) == []
    assert s.refill_count(alive=0, prestart=2) == 0
    assert s.handle(wp.DeferredStartDue(), now=10.2) == [wp.StartWorker(wp.SPAWN)]
    # A worker that registers ends the streak.
    s.handle(wp.WorkerRegistered(), now=11)
    assert s.handle(wp.StartRequested(), now=11) == [wp.StartWorker(wp.SPAWN)]
    assert s.refill_count(alive=1, prestart=2) == 1


def test_killed_or_registered_workers_do_not_count_as_failed_starts() -> None:
    s = wp.WorkerPoolState(wp.SPAWN, validate=True)
    assert s.handle(wp.WorkerExited(registered=False, killed=True, code=-9), now=0) == []
    assert s.handle(wp.WorkerExited(registered=True, killed=False, code=1), now=0) == []
    assert s.handle(wp.StartRequested(), now=0) == [wp.StartWorker(wp.SPAWN)]
    assert s.failed_starts == 0


def test_backoff_grows_and_is_reported_sparingly() -> None:
    s = wp.WorkerPoolState(wp.SPAWN, validate=True)
    reports = []
    for i in range(25):
        for a in s.handle(wp.WorkerExited(registered=False, killed=False, code=1), now=float(i)):
            reports.append(a.in_a_row)
    assert reports == [1, 5, 20]
    assert s.backoff_until == 24 + 2.0  # capped at 2 s


def test_unknown_start_method_is_refused() -> None:
    with pytest.raises(ValueError, match="'fork' or 'spawn'"):
        wp.WorkerPoolState("vfork")
