"""A worker idle after a task reads its owner's socket without sleeping for a while
(``worker_spin_us``), so a caller making sync calls in a loop finds it awake; and it stops
doing so while its tasks come further apart than that (``Executor._read_task``).

Observed from outside, as an operator would: the worker main thread's voluntary context
switches (each one a sleep) and its CPU time, from ``/proc``."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import lumos

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")]


@lumos.remote
class Echo:
    def where(self) -> tuple[int, int]:
        return os.getpid(), threading.get_native_id()  # (the thread that runs calls)

    def ping(self) -> int:
        return 1

    def work(self) -> int:
        time.sleep(0.002)  # (the next calls of a batch arrive meanwhile: they queue)
        return 1


@lumos.remote(num_cpus=1)
def where() -> tuple[int, int]:
    return os.getpid(), threading.get_native_id()  # (the thread that runs calls)


def _sleeps(pid: int, tid: int) -> int:
    """Voluntary context switches of thread ``tid`` of ``pid`` so far."""
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}/{tid}")


def _cpu_s(pid: int, tid: int) -> float:
    """CPU time of thread ``tid`` of ``pid`` so far (seconds)."""
    return int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9


def _sleeps_over(pid: int, tid: int, calls: int, call: Callable[[], Any]) -> int:
    for _ in range(20):
        call()
    before = _sleeps(pid, tid)
    for _ in range(calls):
        call()
    return _sleeps(pid, tid) - before


def _spaced_calls(fresh_cluster: Any, spin_us: int, calls: int, gap_s: float,
                  measure: Callable[[int, int], float]) -> tuple[float, Any, int, int]:
    """A one-CPU cluster with ``worker_spin_us=spin_us`` and a warm actor; ``calls`` sync
    calls ``gap_s`` apart. Returns how much ``measure(pid, tid)`` of the actor's main
    thread grew over them, the actor, and that pid and tid."""
    fresh_cluster(num_cpus=1, _system_config={"worker_spin_us": spin_us})
    actor = Echo.remote()
    pid, tid = lumos.get(actor.where.remote(), timeout=60)
    for _ in range(5):
        lumos.get(actor.ping.remote(), timeout=60)
    before = measure(pid, tid)
    for _ in range(calls):
        time.sleep(gap_s)
        lumos.get(actor.ping.remote(), timeout=60)
    return measure(pid, tid) - before, actor, pid, tid


def test_an_idle_worker_catches_the_next_sync_call_awake(fresh_cluster: Any) -> None:
    # A generous spin, so that the test does not depend on this machine's speed: each
    # next call comes well within it.
    fresh_cluster(num_cpus=1, _system_config={"worker_spin_us": 50_000})
    actor = Echo.remote()
    pid, tid = lumos.get(actor.where.remote(), timeout=60)
    slept = _sleeps_over(pid, tid, 200, lambda: lumos.get(actor.ping.remote(), timeout=60))
    assert slept < 50, f"the actor's main thread slept {slept} times in 200 sync calls"
    lumos.kill(actor)

    pid, tid = lumos.get(where.remote(), timeout=60)
    seen = set()

    def call() -> None:
        seen.add(lumos.get(where.remote(), timeout=60))
    slept = _sleeps_over(pid, tid, 200, call)
    assert seen == {(pid, tid)}  # (one CPU: one worker ran them all)
    assert slept < 50, f"the worker's main thread slept {slept} times in 200 sync tasks"


def test_without_a_spin_the_worker_sleeps_between_calls(fresh_cluster: Any) -> None:
    # Calls 20 ms apart: a spin of that length would catch each of them awake; without
    # one the actor sleeps in each gap. (Calls back to back are no test of it: on a
    # loaded machine the next call is often there before the actor looks.)
    slept, _, _, _ = _spaced_calls(fresh_cluster, 0, 20, 0.02, _sleeps)
    assert slept >= 15, f"the actor's main thread slept only {slept} times in 20 calls 20 ms apart"


def test_a_worker_stops_spinning_while_its_calls_come_far_apart(fresh_cluster: Any) -> None:
    # Ten calls 150 ms apart: spinning after each would burn 10 x 40 ms of the worker's CPU;
    # only the spin after the first of them misses.
    burnt, actor, pid, tid = _spaced_calls(fresh_cluster, 40_000, 10, 0.15, _cpu_s)
    assert burnt < 0.2, f"the actor's main thread used {burnt * 1e3:.0f} ms of CPU for 10 calls far apart"
    # Calls close together again: the first of them shows the spin would pay, and it is back.
    slept = _sleeps_over(pid, tid, 200, lambda: lumos.get(actor.ping.remote(), timeout=60))
    assert slept < 50, f"the actor's main thread slept {slept} times in 200 sync calls"


def test_no_spin_after_a_batch_of_calls_that_queued(fresh_cluster: Any) -> None:
    # Batches of 8 calls in flight 20 ms apart, with a 40 ms spin: each next batch would
    # come within the spin, so spinning after a batch's last call would "pay" and burn
    # ~20 ms of CPU per batch, taking a core from a caller that gathers its results. A
    # call that came through the queue (while the one before ran) is followed by no spin.
    fresh_cluster(num_cpus=1, _system_config={"worker_spin_us": 40_000})
    actor = Echo.remote()
    pid, tid = lumos.get(actor.where.remote(), timeout=60)
    lumos.get([actor.work.remote() for _ in range(8)], timeout=60)
    before = _cpu_s(pid, tid)
    for _ in range(10):
        time.sleep(0.02)
        assert lumos.get([actor.work.remote() for _ in range(8)], timeout=60) == [1] * 8
    burnt = _cpu_s(pid, tid) - before
    assert burnt < 0.1, f"the actor's main thread used {burnt * 1e3:.0f} ms of CPU for 10 batches of 8 calls"
    # A sync caller after them still finds it awake.
    slept = _sleeps_over(pid, tid, 200, lambda: lumos.get(actor.ping.remote(), timeout=60))
    assert slept < 50, f"the actor's main thread slept {slept} times in 200 sync calls"
