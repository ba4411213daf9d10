"""An owner's io thread, after a task's reply released a user thread's wait for one object
(a sync call's get), polls its sockets without sleeping for a while (``owner_spin_us``),
so the reply to that thread's next call finds it awake; it does not spin after such
replies that come further apart, nor after replies that release no such wait (a get of
many objects; others' replies while a thread waits for a long task)
(``ResultsMixin._spin_after_reply``).

Observed as an operator would, from ``/proc`` (the io thread's CPU time and, without a
spin, its voluntary context switches: each a sleep in ``epoll``), and through the core
worker's counts of its spins and of the replies that came while it spun. Not through the
io thread's sleeps with a spin: whether the spin saves them depends on where the
scheduler puts the threads (on 2 cores the caller and the worker now and then share one
while the io thread spins on the other, and it then waits for the GIL instead)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import lumos

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")]


@lumos.remote
def noop() -> int:
    return 1


@lumos.remote
def nap(seconds: float) -> int:
    time.sleep(seconds)
    return 1


@lumos.remote
class Echo:
    def ping(self) -> int:
        return 1


def _io_thread(cw: Any) -> int:
    tid = cw.io.thread.native_id
    assert tid is not None
    return int(tid)


def _sleeps(tid: int) -> int:
    """Voluntary context switches of this process's thread ``tid`` so far."""
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for thread {tid}")


def _cpu_s(tid: int) -> float:
    """CPU time of this process's thread ``tid`` so far (seconds)."""
    return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9


def _growth_over(count: Callable[[], int], calls: int, call: Callable[[], Any]) -> int:
    """How much ``count()`` grew over ``calls`` calls of ``call``, after 20 to warm up."""
    for _ in range(20):
        call()
    before = count()
    for _ in range(calls):
        call()
    return count() - before


def _sleeps_over(tid: int, calls: int, call: Callable[[], Any]) -> int:
    return _growth_over(lambda: _sleeps(tid), calls, call)


def _start(fresh_cluster: Any, spin_us: int, num_cpus: int = 1) -> Any:
    # A generous spin where one is wanted, so that the test does not depend on this
    # machine's speed: each next reply comes well within it.
    fresh_cluster(num_cpus=num_cpus, _system_config={"owner_spin_us": spin_us})
    from lumos._private import worker_context
    return worker_context.require()


def _caught_over(cw: Any, calls: int, call: Callable[[], Any]) -> int:
    return _growth_over(lambda: int(cw.spin_catches), calls, call)


def test_the_owner_catches_the_reply_to_its_next_sync_call_awake(fresh_cluster: Any) -> None:
    cw = _start(fresh_cluster, 50_000)
    caught = _caught_over(cw, 300, lambda: lumos.get(noop.remote(), timeout=60))
    assert caught >= 270, f"the driver's io thread spun for {caught} of the replies to 300 sync tasks"
    actor = Echo.remote()
    caught = _caught_over(cw, 300, lambda: lumos.get(actor.ping.remote(), timeout=60))
    assert caught >= 270, f"the driver's io thread spun for {caught} of the replies to 300 sync actor calls"


def test_without_a_spin_the_owner_sleeps_until_each_reply(fresh_cluster: Any) -> None:
    # The control for the test above: the same loop, the spin off.
    cw = _start(fresh_cluster, 0)
    tid = _io_thread(cw)
    slept = _sleeps_over(tid, 300, lambda: lumos.get(noop.remote(), timeout=60))
    assert slept >= 225, f"the driver's io thread slept only {slept} times in 300 sync tasks"
    assert cw.spins == 0 and cw.spin_catches == 0


def test_the_owner_does_not_spin_after_replies_that_come_far_apart(fresh_cluster: Any) -> None:
    # Tasks of 60 ms, one after the other: a spin of 40 ms after each reply would miss the
    # next and burn 40 ms of the io thread's CPU each time.
    cw = _start(fresh_cluster, 40_000)
    tid = _io_thread(cw)
    lumos.get(nap.remote(0.06), timeout=60)
    spins, before = cw.spins, _cpu_s(tid)
    for _ in range(10):
        lumos.get(nap.remote(0.06), timeout=60)
    burnt = _cpu_s(tid) - before
    assert cw.spins - spins <= 1, cw.spins - spins
    assert burnt < 0.15, f"the driver's io thread used {burnt * 1e3:.0f} ms of CPU for 10 replies far apart"
    # Sync calls close together again: the spin is back from the second reply on.
    caught = _caught_over(cw, 300, lambda: lumos.get(noop.remote(), timeout=60))
    assert caught >= 270, f"the driver's io thread spun for {caught} of the replies to 300 sync tasks"


def test_a_get_of_many_objects_starts_no_spin(fresh_cluster: Any) -> None:
    # A burst's get waits for all of them: its replies come in batches the io thread
    # handles awake anyway, and a spin between them would take a core from the workers.
    cw = _start(fresh_cluster, 50_000)
    lumos.get([noop.remote() for _ in range(50)], timeout=60)
    spins = cw.spins
    for _ in range(5):
        assert lumos.get([noop.remote() for _ in range(200)], timeout=60) == [1] * 200
    assert cw.spins == spins


def test_replies_that_release_no_wait_for_one_object_start_no_spin(fresh_cluster: Any) -> None:
    # One thread waits for a long task (on one CPU) while another gets bursts of short
    # ones (on the other): their replies come close together, and none of them is what
    # a waiting thread waits for.
    cw = _start(fresh_cluster, 50_000, num_cpus=2)
    lumos.get([noop.remote() for _ in range(50)], timeout=60)
    spins = cw.spins
    long = nap.remote(3)
    done = threading.Event()
    bursts_done = []

    def bursts() -> None:
        try:
            while not done.is_set():
                assert lumos.get([noop.remote() for _ in range(50)], timeout=60) == [1] * 50
                bursts_done.append(1)
        finally:
            done.set()
    t = threading.Thread(target=bursts)
    t.start()
    try:
        assert lumos.get(long, timeout=60) == 1
    finally:
        done.set()
        t.join(60)
    assert len(bursts_done) >= 10, len(bursts_done)  # (they ran while the long task did)
    assert cw.spins - spins <= 1, cw.spins - spins  # (the long task's own reply may stretch one)
