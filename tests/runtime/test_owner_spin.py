"""An owner's io thread, after a task's reply released a user thread's wait for one object
(a sync call's get), polls its sockets without sleeping for a while (``owner_spin_us``),
so the reply to that thread's next call finds it awake; it does not spin after such
replies that come further apart, nor after replies that release no such wait (a get of
many objects; others' replies while a thread waits for a long task), nor while the spin
is seen not to shorten the gaps between them (``ResultsMixin._spin_after_reply``,
``_spin_pays``).

Observed as an operator would, from ``/proc`` (the io thread's CPU time and, without a
spin, its voluntary context switches: each a sleep in ``epoll``), and through the core
worker's counts of its spins and of the replies that came while it spun. Whether a spin
saves a wake-up depends on where the scheduler puts the threads (on 2 cores, now and
then it does not, and the check then turns the spin off), so the tests of the spin turn
that check off; the check is tested with a caller it does not pay for, and with given
gaps."""

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


def _sleeps_over(tid: int, calls: int, call: Callable[[], Any]) -> int:
    for _ in range(20):
        call()
    before = _sleeps(tid)
    for _ in range(calls):
        call()
    return _sleeps(tid) - before


def _start(fresh_cluster: Any, spin_us: int, num_cpus: int = 1, check: bool = False) -> Any:
    # A generous spin where one is wanted, so that the test does not depend on this
    # machine's speed: each next reply comes well within it.
    fresh_cluster(num_cpus=num_cpus, _system_config={"owner_spin_us": spin_us})
    from lumos._private import worker_context
    cw = worker_context.require()
    cw._spin_check = check
    return cw


def _caught_over(cw: Any, calls: int, call: Callable[[], Any]) -> int:
    for _ in range(20):
        call()
    before = cw.spin_catches
    for _ in range(calls):
        call()
    return int(cw.spin_catches - before)


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


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_spin_that_does_not_shorten_the_round_is_turned_off(fresh_cluster: Any) -> None:
    # A caller that works 20 ms between its sync calls of 2 ms tasks: a 50 ms spin catches
    # each reply, but saves well under 1% of the gap between them, for an io thread busy
    # all the time. (The tasks take 2 ms so that each get waits for its reply: on a loaded
    # machine a no-op's reply may come before its caller asks for it.)
    from lumos._private.core_worker.results import SPIN_SAMPLE
    cw = _start(fresh_cluster, 50_000, check=True)
    tid = _io_thread(cw)
    for _ in range(4 * SPIN_SAMPLE):  # its cycle's sample with the spin, then without
        lumos.get(nap.remote(0.002), timeout=60)
        _busy(0.02)
        if cw._spin_n >= 2 * SPIN_SAMPLE:
            break
    assert cw._spin_n >= 2 * SPIN_SAMPLE and not cw._spin_on
    spins, before = cw.spins, _cpu_s(tid)
    for _ in range(100):
        lumos.get(nap.remote(0.002), timeout=60)
        _busy(0.02)
    burnt = _cpu_s(tid) - before
    assert cw.spins == spins, cw.spins - spins
    assert burnt < 0.4, f"the driver's io thread used {burnt * 1e3:.0f} ms of CPU over 100 calls 20 ms apart"


class _Check:
    """The state ``_spin_pays`` keeps (as ``CoreWorker`` sets it up), for given gaps."""

    def __init__(self) -> None:
        self._spin_n = 0
        self._spin_check = True
        self._spin_on = True
        self._gaps_spun: list[float] = []
        self._gaps_unspun: list[float] = []
        self._unspun_median = 0.0

    def feed(self, gap_spun: float, gap_unspun: float, releases: int) -> list[bool]:
        """``releases`` releases, each ``gap_spun`` after the one before if that one spun,
        else ``gap_unspun``; what ``_spin_pays`` said after each."""
        from lumos._private.core_worker.results import ResultsMixin
        said: list[bool] = []
        spun = True
        for _ in range(releases):
            spun = ResultsMixin._spin_pays(self, gap_spun if spun else gap_unspun)  # type: ignore[arg-type]
            said.append(spun)
        return said


def test_the_check_keeps_a_spin_that_shortens_the_gaps_and_drops_one_that_does_not() -> None:
    from lumos._private.core_worker.results import SPIN_CYCLE, SPIN_SAMPLE
    check = _Check()
    said = check.feed(70e-6, 120e-6, SPIN_CYCLE)
    assert said[:SPIN_SAMPLE] == [True] * SPIN_SAMPLE  # its sample with the spin
    assert said[SPIN_SAMPLE:2 * SPIN_SAMPLE - 1] == [False] * (SPIN_SAMPLE - 1)  # and without
    assert all(said[2 * SPIN_SAMPLE - 1:])  # it paid: on for the rest of the cycle
    check = _Check()
    said = check.feed(200e-6, 120e-6, SPIN_CYCLE)
    assert said[:SPIN_SAMPLE] == [True] * SPIN_SAMPLE
    assert not any(said[SPIN_SAMPLE:])  # it cost: off for the rest of the cycle
    said = check.feed(70e-6, 120e-6, 2 * SPIN_SAMPLE)
    assert said[:SPIN_SAMPLE] == [True] * SPIN_SAMPLE and said[-1]  # measured again in the next
    # A spin that stops paying within a cycle (the scheduler moved the threads) is
    # measured again at once, with the gaps it has just made, and dropped.
    said = check.feed(200e-6, 120e-6, 3 * SPIN_SAMPLE)
    assert said[:SPIN_SAMPLE - 1] == [True] * (SPIN_SAMPLE - 1)
    assert not any(said[SPIN_SAMPLE - 1:])
    assert not check._spin_on
    # Gaps equal with and without it: a spin that saves nothing is off.
    check = _Check()
    said = check.feed(120e-6, 120e-6, 3 * SPIN_SAMPLE)
    assert not any(said[2 * SPIN_SAMPLE:])
