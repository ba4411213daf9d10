"""The raylet's worker pool: workers that cannot start are retried with backoff."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil

import lumos
from tests.conftest import lumos_children, wait_for


def _workers() -> list:
    out = []
    for p in lumos_children():
        try:
            if "lumos._private.worker.main" in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:  # exited since it was listed
            continue
    return out


def test_workers_failing_at_start_do_not_respawn_in_a_loop(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    ctx = fresh_cluster(num_cpus=2, include_dashboard=False)
    session = ctx.address_info["session_dir"]
    token = os.path.join(session, "token")
    with open(token, "rb") as f:
        saved = f.read()
    seen: set[int] = set()
    try:
        os.rename(token, token + ".away")  # new workers cannot authenticate: they exit at start
        for p in _workers():
            os.kill(p.pid, signal.SIGKILL)
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            seen.update(p.pid for p in _workers())
            time.sleep(0.05)
        # Backoff doubles from 0.2 s: a handful of attempts in 4 s, not hundreds.
        assert len(seen) <= 10, f"{len(seen)} worker processes started in 4 s"
    finally:
        os.rename(token + ".away", token)
    with open(token, "rb") as f:
        assert f.read() == saved
    # Without any demand, the pre-started pool (one per CPU) comes back in full once a
    # worker can register again (the backoff starts one at a time).
    wait_for(lambda: len(_workers()) >= 2, 30)

    @lumos.remote
    def ok() -> int:
        return 1

    assert lumos.get(ok.remote(), timeout=60) == 1  # the pool recovers once workers can start


def test_actors_beyond_the_worker_cap_still_start(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    # The cap bounds the processes that run tasks; every actor has a process of its own.
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"max_workers_per_node": 2})

    @lumos.remote
    class Box:
        def pid(self) -> int:
            return os.getpid()

    boxes = [Box.remote() for _ in range(5)]
    pids = lumos.get([b.pid.remote() for b in boxes], timeout=90)
    assert len(set(pids)) == 5

    @lumos.remote
    def ok() -> int:
        return 1

    # Tasks still get a worker (the cap counts task workers only).
    assert lumos.get([ok.remote() for _ in range(4)], timeout=60) == [1] * 4
    for b in boxes:
        lumos.kill(b)


@lumos.remote
def _chain(n: int, hold_s: float = 0.0) -> int:
    if n == 0:
        time.sleep(hold_s)  # every link above waits in get() meanwhile
        return 0
    return 1 + lumos.get(_chain.remote(n - 1, hold_s))


def test_a_chain_of_nested_tasks_deeper_than_the_worker_cap_completes(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    # Each task waits in get() for the next: every link needs a process, and a worker
    # blocked in get() is not counted against the cap (it was: the third link waited for ever).
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"max_workers_per_node": 2})
    from lumos._private import worker_context
    warnings: list[tuple[str, str]] = []
    worker_context.require().error_handler = lambda kind, text: warnings.append((kind, text))
    assert lumos.get(_chain.remote(5, 0.5), timeout=90) == 5
    # The driver is told once so many workers wait (each is a process: runaway recursion
    # shows there first), and again at each doubling: five waiting links reach 2 and 4 at
    # most, so one or two warnings, as the raylet's ticks happened to see them.
    wait_for(lambda: any(kind == "workers" for kind, _ in warnings), 10)
    texts = [t for kind, t in warnings if kind == "workers"]
    assert 1 <= len(texts) <= 2, texts
    assert all("wait in get() or wait()" in t and "at most 2" in t for t in texts)

    @lumos.remote
    def ok() -> int:
        return 1

    assert lumos.get([ok.remote() for _ in range(4)], timeout=60) == [1] * 4


def test_a_barrier_of_tasks_wider_than_the_lease_cap_completes(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    # Every member waits in get() until all have arrived, so all must run at once: the
    # leases of members waiting in get() do not count against the owner's per-function
    # cap (they did: the fifth member never got a worker and the barrier waited for ever).
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"max_leases_per_scheduling_key": 4})

    @lumos.remote(num_cpus=0)
    class Barrier:
        def __init__(self, n: int) -> None:
            self.n = n
            self.arrived = 0
            self.all_here: Any = None

        async def arrive(self) -> int:
            import asyncio
            if self.all_here is None:
                self.all_here = asyncio.Event()
            self.arrived += 1
            if self.arrived >= self.n:
                self.all_here.set()
            await self.all_here.wait()
            return self.arrived

    @lumos.remote(num_cpus=0)
    def member(barrier: Any) -> int:
        return lumos.get(barrier.arrive.remote())

    barrier = Barrier.remote(8)
    assert lumos.get([member.remote(barrier) for _ in range(8)], timeout=90) == [8] * 8


def test_one_owner_runs_a_function_on_more_than_64_workers_at_once(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    # The owner's lease cap per function was 64: on a cluster with more CPUs, one driver's
    # burst of one function left the rest idle. Each task sleeps (not blocked in get, so
    # every lease counts) and says when it ran; more than 64 must overlap.
    fresh_cluster(num_cpus=72, include_dashboard=False)

    @lumos.remote
    def nap() -> tuple[float, float]:
        start = time.time()
        time.sleep(5.0)  # (long enough for 72 workers to start on a busy 2-core machine)
        return start, time.time()

    spans = lumos.get([nap.remote() for _ in range(72)], timeout=120)
    points = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in points:
        running += step
        most = max(most, running)
    assert most > 64, f"at most {most} tasks ran at once"


def test_many_functions_submitted_at_once_share_the_workers(fresh_cluster) -> None:  # type: ignore[no-untyped-def]
    """Every function has its own queue and asks the raylet for a worker; a worker that goes
    idle runs the waiting tasks of other functions of the same shape at once. It waited out
    the idle timeout first (the raylet had no CPU free meanwhile): ~100 ms a function by
    default, here 60 s, so on the old code this get timed out."""
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"lease_idle_timeout_ms": 60_000})

    def make(i: int) -> Any:
        def f() -> int:
            return i
        f.__qualname__ = f"f{i}"
        return lumos.remote(f)

    fns = [make(i) for i in range(12)]
    assert lumos.get([f.remote() for f in fns], timeout=45) == list(range(12))
    # And calls alternating between them, one at a time, reuse the same worker.
    assert [lumos.get(f.remote(), timeout=45) for f in fns for _ in range(2)] == [i for i in range(12) for _ in range(2)]
