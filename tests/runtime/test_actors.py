"""Actors: creation, ordering, names, kill and exit, restarts, concurrency, pools, events."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest

import lumos
from lumos.exceptions import ActorDiedError, TaskError
from lumos.util import ActorPool

from tests.conftest import process_gone, wait_for


@lumos.remote
class Counter:
    def __init__(self, start: int = 0) -> None:
        self.n = start

    def incr(self, by: int = 1) -> int:
        self.n += by
        return self.n

    def value(self) -> int:
        return self.n

    def pid(self) -> int:
        return os.getpid()

    def fail(self) -> None:
        raise KeyError("boom")

    def die(self) -> None:
        os._exit(3)

    @lumos.method(num_returns=2)
    def pair(self) -> tuple[int, int]:
        return self.n, -self.n


@lumos.remote
class Log:
    def __init__(self) -> None:
        self.seen: list[int] = []

    def add(self, i: int) -> None:
        self.seen.append(i)

    def get(self) -> list[int]:
        return self.seen


class InitError(Exception):
    pass


# --------------------------------------------------------------------------- basics


def test_create_call_and_options(cluster: lumos.LumosContext) -> None:
    c = Counter.remote(10)
    assert isinstance(c, lumos.ActorHandle)
    assert lumos.get(c.incr.remote()) == 11
    assert lumos.get(c.incr.remote(by=5)) == 16
    a, b = c.pair.remote()
    assert lumos.get([a, b]) == [16, -16]
    assert lumos.get(c.pair.options(num_returns=1).remote()) == (16, -16)
    c2 = Counter.options(num_cpus=0.5, name=None).remote()
    assert lumos.get(c2.value.remote()) == 0


def test_misuse_gives_clear_errors(cluster: lumos.LumosContext) -> None:
    with pytest.raises(TypeError, match="cannot be instantiated directly"):
        Counter()
    c = Counter.remote()
    with pytest.raises(TypeError, match="cannot be called directly"):
        c.incr()
    with pytest.raises(AttributeError, match="no method 'nope'"):
        c.nope.remote()
    with pytest.raises(ValueError, match="invalid option"):
        Counter.options(num_returns=2)
    with pytest.raises(TypeError, match="actor handle"):
        lumos.kill("not a handle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="get_if_exists"):
        Counter.options(get_if_exists=True).remote()


def test_calls_from_one_caller_run_in_order(cluster: lumos.LumosContext) -> None:
    log = Log.remote()
    n = 3000
    for i in range(n):
        log.add.remote(i)
    assert lumos.get(log.get.remote()) == list(range(n))


def test_order_kept_when_an_earlier_call_waits_for_its_argument(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    def slow(x: int) -> int:
        time.sleep(0.3)
        return x

    log = Log.remote()
    log.add.remote(slow.remote(0))
    log.add.remote(1)
    assert lumos.get(log.get.remote()) == [0, 1]


def test_handles_work_in_tasks_and_other_actors(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()

    @lumos.remote
    def bump(handle: lumos.ActorHandle, times: int) -> int:
        return lumos.get([handle.incr.remote() for _ in range(times)])[-1]

    @lumos.remote
    class Forwarder:
        def __init__(self, target: lumos.ActorHandle) -> None:
            self.target = target

        def go(self) -> int:
            return lumos.get(self.target.incr.remote(100))

    assert lumos.get(bump.remote(c, 3)) == 3
    f = Forwarder.remote(c)
    assert lumos.get(f.go.remote()) == 103
    assert lumos.get(c.value.remote()) == 103


def test_refs_as_arguments_and_large_values(cluster: lumos.LumosContext) -> None:
    import numpy as np

    @lumos.remote
    class Holder:
        def __init__(self, arr: np.ndarray) -> None:
            self.arr = arr

        def total(self, extra: np.ndarray) -> float:
            return float(self.arr.sum() + extra.sum())

        def big(self) -> np.ndarray:
            return np.ones(1_000_000)

    arr = np.ones(500_000)
    h = Holder.remote(lumos.put(arr))
    assert lumos.get(h.total.remote(arr)) == 1_000_000.0
    assert lumos.get(h.big.remote()).sum() == 1_000_000


# --------------------------------------------------------------------------- names


def test_named_actors(cluster: lumos.LumosContext) -> None:
    a = Counter.options(name="shared-counter").remote(5)
    b = lumos.get_actor("shared-counter")
    assert lumos.get(b.incr.remote()) == 6
    assert lumos.get(a.value.remote()) == 6
    with pytest.raises(lumos.exceptions.ActorAlreadyExistsError, match="already exists") as info:
        Counter.options(name="shared-counter").remote()
    assert isinstance(info.value, ValueError)  # (Ray's class is one)
    assert "shared-counter" in lumos.util.list_named_actors()
    same = Counter.options(name="shared-counter", get_if_exists=True).remote(100)
    assert lumos.get(same.value.remote()) == 6
    with pytest.raises(ValueError, match="no actor named 'missing'"):
        lumos.get_actor("missing")
    other = Counter.options(name="shared-counter", namespace="elsewhere").remote(1)
    assert lumos.get(lumos.get_actor("shared-counter", namespace="elsewhere").value.remote()) == 1
    assert {"name": "shared-counter", "namespace": "elsewhere"} in lumos.util.list_named_actors(all_namespaces=True)
    lumos.kill(other)
    lumos.kill(a)
    with pytest.raises(ValueError):
        wait_for(lambda: not _named_exists("shared-counter"), 5)
        lumos.get_actor("shared-counter")


def _named_exists(name: str) -> bool:
    try:
        lumos.get_actor(name)
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------- kill, exit


def test_kill_fails_pending_and_later_calls(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    pid = lumos.get(c.pid.remote())
    lumos.kill(c)
    with pytest.raises(ActorDiedError, match="killed by lumos.kill"):
        lumos.get(c.incr.remote(), timeout=10)
    wait_for(lambda: process_gone(pid), 10)


@lumos.remote
class _Restartable:
    def pid(self) -> int:
        return os.getpid()

    def restarted(self) -> bool:
        return lumos.get_runtime_context().was_current_actor_reconstructed


def test_kill_with_restart_restarts(cluster: lumos.LumosContext) -> None:
    c = Counter.options(max_restarts=1).remote(7)
    pid = lumos.get(c.pid.remote())
    lumos.kill(c, no_restart=False)
    new_pid = wait_for(lambda: _pid_or_none(c, pid), 15)
    assert new_pid != pid
    assert lumos.get(c.value.remote()) == 7  # constructor re-ran
    r = _Restartable.options(max_restarts=1).remote()
    assert lumos.get(r.restarted.remote(), timeout=30) is False
    pid = lumos.get(r.pid.remote(), timeout=30)
    lumos.kill(r, no_restart=False)
    wait_for(lambda: _pid_or_none(r, pid), 15)
    assert lumos.get(r.restarted.remote(), timeout=30) is True  # (it was always False)
    assert lumos.get_runtime_context().was_current_actor_reconstructed is False  # (the driver)


def _pid_or_none(c: lumos.ActorHandle, old: int) -> int | None:
    try:
        p = lumos.get(c.pid.remote(), timeout=5)
    except lumos.exceptions.RayActorError:  # (restarting: ActorUnavailableError)
        return None
    return p if p != old else None


def test_exit_actor(cluster: lumos.LumosContext, tmp_path: Any) -> None:
    cleaned = tmp_path / "cleaned"

    @lumos.remote
    class Quitter:
        def __init__(self, mark: str = "", finalized: str = "") -> None:
            self.finalized = finalized
            if mark:  # as a Python exit does, exit_actor() runs atexit handlers (Ray too)
                import atexit
                atexit.register(lambda: open(mark, "w").write("cleaned"))

        def __del__(self) -> None:  # as in Ray, an actor that ends on purpose is finalized
            if self.finalized:
                with open(self.finalized, "a") as f:
                    f.write("del;")

        def bye(self) -> None:
            lumos.actor.exit_actor()

        def ping(self) -> str:
            return "pong"

    finalized = tmp_path / "finalized"
    q = Quitter.options(max_restarts=3).remote(str(cleaned), str(finalized))
    assert lumos.get(q.ping.remote()) == "pong"
    with pytest.raises(ActorDiedError, match="exit_actor"):
        lumos.get(q.bye.remote(), timeout=10)
    assert cleaned.read_text() == "cleaned"
    assert finalized.read_text() == "del;"  # once
    with pytest.raises(ActorDiedError, match="exit_actor"):
        lumos.get(q.ping.remote(), timeout=10)
    with pytest.raises(TypeError, match="inside an actor"):
        lumos.actor.exit_actor()

    terminated = tmp_path / "terminated"
    t = Quitter.remote("", str(terminated))
    assert lumos.get(t.ping.remote()) == "pong"
    t.__ray_terminate__.remote()
    with pytest.raises(ActorDiedError):
        lumos.get(t.ping.remote(), timeout=10)
    wait_for(lambda: terminated.exists() and terminated.read_text() == "del;", 10)


def test_actor_ends_when_its_handles_go_out_of_scope(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    pid = lumos.get(c.pid.remote())
    ref = c.incr.remote()
    del c
    assert lumos.get(ref) == 1  # calls already submitted still run
    wait_for(lambda: process_gone(pid), 10)


@lumos.remote
class Tidy:
    """Leaves a mark from each clean-up hook a graceful end runs."""

    def __init__(self, marks: str) -> None:
        import atexit
        self.marks = marks
        atexit.register(self._mark, "atexit")

    def _mark(self, what: str) -> None:
        with open(self.marks, "a") as f:
            f.write(what + ";")

    def __ray_shutdown__(self) -> None:
        self._mark("shutdown")

    def __del__(self) -> None:
        self._mark("del")

    def pid(self) -> int:
        return os.getpid()


def test_an_actor_out_of_scope_runs_its_clean_up_before_it_ends(cluster: lumos.LumosContext, tmp_path: Any) -> None:
    # As in Ray: the end of an actor nobody can call any more is graceful
    # (``__ray_shutdown__``, then ``__del__`` and atexit handlers); lumos.kill is not.
    marks = tmp_path / "marks"
    t = Tidy.remote(str(marks))
    pid = lumos.get(t.pid.remote(), timeout=30)
    del t
    wait_for(lambda: process_gone(pid), 20)
    assert marks.read_text() == "shutdown;del;atexit;"

    killed = tmp_path / "killed"
    k = Tidy.remote(str(killed))
    pid = lumos.get(k.pid.remote(), timeout=30)
    lumos.kill(k)
    wait_for(lambda: process_gone(pid), 20)
    assert not killed.exists()


@pytest.mark.slow
def test_a_frozen_actor_out_of_scope_is_still_ended_after_its_grace(cluster: lumos.LumosContext,
                                                                   tmp_path: Any) -> None:
    # Asked to exit, a worker that cannot (stopped, or its clean-up hangs) is killed once
    # its grace period is over: the actor's resources come back.
    t = Tidy.remote(str(tmp_path / "marks"))
    pid = lumos.get(t.pid.remote(), timeout=30)
    os.kill(pid, signal.SIGSTOP)
    try:
        del t
        wait_for(lambda: process_gone(pid), 40)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_a_named_actor_ends_with_its_creators_handle(cluster: lumos.LumosContext) -> None:
    # As in Ray: a name does not keep a non-detached actor alive (it lived until the job
    # ended), and handles from get_actor do not either.
    c = Counter.options(name="ends-with-its-handle").remote()
    pid = lumos.get(c.pid.remote(), timeout=30)
    looked_up = lumos.get_actor("ends-with-its-handle")
    del c
    wait_for(lambda: process_gone(pid), 10)
    with pytest.raises(ValueError, match="no actor named 'ends-with-its-handle'"):
        lumos.get_actor("ends-with-its-handle")
    with pytest.raises(ActorDiedError, match="out of scope"):
        lumos.get(looked_up.pid.remote(), timeout=30)
    kept = Counter.options(name="kept-by-its-handle").remote()
    assert lumos.get(lumos.get_actor("kept-by-its-handle").incr.remote(), timeout=30) == 1
    del kept


# --------------------------------------------------------------------------- failures


def test_exception_in_method_fails_only_that_call(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    with pytest.raises(KeyError) as info:
        lumos.get(c.fail.remote())
    assert isinstance(info.value, TaskError)
    assert "boom" in str(info.value) and ", in fail" in str(info.value)
    assert lumos.get(c.incr.remote()) == 1


def test_exception_in_init_makes_every_call_raise_actor_died_with_it(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class Broken:
        def __init__(self) -> None:
            raise InitError("bad config")

        def f(self) -> int:
            return 1

    b = Broken.remote()
    for _ in range(2):  # as in Ray: RayActorError (ActorDiedError) naming the constructor's error
        with pytest.raises(ActorDiedError, match="creation task(.|\n)*InitError: bad config") as info:
            lumos.get(b.f.remote(), timeout=10)
        assert isinstance(info.value, lumos.exceptions.RayActorError)
        assert isinstance(info.value.cause, InitError)


def test_process_death_without_restarts_is_actor_died(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    lumos.get(c.incr.remote())
    with pytest.raises(ActorDiedError, match="died"):
        lumos.get(c.die.remote(), timeout=15)
    with pytest.raises(ActorDiedError, match="max_restarts=0"):
        lumos.get(c.incr.remote(), timeout=15)


def test_restart_reruns_init_and_retries_calls(cluster: lumos.LumosContext) -> None:
    c = Counter.options(max_restarts=2, max_task_retries=0).remote(1)
    pid = lumos.get(c.pid.remote())
    # In flight at the crash, no retries: ActorUnavailableError (a RayActorError, and not an
    # ActorDiedError: the actor lives on), as in Ray.
    with pytest.raises(lumos.exceptions.RayActorError, match="is unavailable: .*being restarted") as info:
        lumos.get(c.die.remote(), timeout=15)
    assert type(info.value) is lumos.exceptions.ActorUnavailableError
    assert not isinstance(info.value, ActorDiedError)
    assert lumos.get(c.incr.remote(), timeout=15) == 2  # queued behind it: runs on the new instance
    assert lumos.get(c.pid.remote()) != pid
    assert "max_task_retries=0" in str(info.value)
    # A call that kills the actor each time: retried max_task_retries times, then failed
    # with a message that says they were used up (it said max_task_retries=0).
    d = Counter.options(max_restarts=3, max_task_retries=1).remote(1)
    with pytest.raises(lumos.exceptions.ActorUnavailableError, match="max_task_retries=1 were used up"):
        lumos.get(d.die.remote(), timeout=30)
    lumos.kill(d)

    r = Counter.options(max_restarts=1, max_task_retries=1).remote()
    first = lumos.get(r.pid.remote())
    os.kill(first, signal.SIGKILL)
    assert lumos.get(r.pid.remote(), timeout=15) != first  # retried on the restarted actor
    os.kill(lumos.get(r.pid.remote()), signal.SIGKILL)
    with pytest.raises(ActorDiedError, match="restarted 1 times"):
        lumos.get([r.pid.remote() for _ in range(3)], timeout=15)


def test_checkpointed_actor_loses_no_acknowledged_state(cluster: lumos.LumosContext) -> None:
    @lumos.remote(max_restarts=-1, max_task_retries=-1)
    class Account:
        def __init__(self) -> None:
            self.balance = 0

        def deposit(self, amount: int) -> int:
            self.balance += amount
            return self.balance

        def pid(self) -> int:
            return os.getpid()

        def __lumos_checkpoint__(self) -> dict[str, int]:
            return {"balance": self.balance}

        def __lumos_restore__(self, state: dict[str, int]) -> None:
            self.balance = state["balance"]

    acct = Account.options(checkpoint_interval=4).remote()
    acknowledged = 0
    stop = threading.Event()
    kills = []

    def killer() -> None:
        while not stop.is_set() and len(kills) < 3:
            time.sleep(0.3)
            try:
                pid = lumos.get(acct.pid.remote(), timeout=10)
                os.kill(pid, signal.SIGKILL)
                kills.append(pid)
            except (ProcessLookupError, ActorDiedError):
                pass

    th = threading.Thread(target=killer)
    th.start()
    try:
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            refs = [acct.deposit.remote(1) for _ in range(10)]
            values = lumos.get(refs, timeout=30)
            # at-least-once: a retried deposit may apply twice, never zero times
            assert values[-1] >= acknowledged + 10, (values, acknowledged)
            acknowledged = values[-1]
    finally:
        stop.set()
        th.join()
    assert len(kills) >= 2
    assert lumos.get(acct.deposit.remote(0), timeout=30) >= acknowledged


# --------------------------------------------------------------------------- concurrency


def test_async_actor_runs_calls_concurrently(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class AsyncWorker:
        def __init__(self) -> None:
            self.running = 0
            self.peak = 0

        async def work(self, t: float) -> int:
            self.running += 1
            self.peak = max(self.peak, self.running)
            await asyncio.sleep(t)
            self.running -= 1
            return self.peak

        def peak_seen(self) -> int:
            return self.peak

    a = AsyncWorker.remote()
    t0 = time.monotonic()
    lumos.get([a.work.remote(0.5) for _ in range(20)])
    assert time.monotonic() - t0 < 3.0
    assert lumos.get(a.peak_seen.remote()) == 20

    limited = AsyncWorker.options(max_concurrency=3).remote()
    lumos.get([limited.work.remote(0.1) for _ in range(12)])
    assert lumos.get(limited.peak_seen.remote()) == 3


def test_an_async_init_is_awaited_on_the_actors_loop(cluster: lumos.LumosContext) -> None:
    # As in Ray; it failed: "__init__() should return None, not 'coroutine'".
    @lumos.remote
    class Opens:
        async def __init__(self, x: int) -> None:
            await asyncio.sleep(0.01)
            self.x = x
            self.loop = id(asyncio.get_running_loop())

        async def get(self) -> tuple[int, bool]:
            return self.x, self.loop == id(asyncio.get_running_loop())

    @lumos.remote
    class FailsToOpen:
        async def __init__(self) -> None:
            await asyncio.sleep(0)
            raise InitError("cannot open")

        async def get(self) -> int:
            return 1

    assert lumos.get(Opens.remote(5).get.remote(), timeout=30) == (5, True)
    with pytest.raises(ActorDiedError, match="InitError: cannot open"):
        lumos.get(FailsToOpen.remote().get.remote(), timeout=30)


def test_async_actor_plain_method_returning_a_ref_returns_the_ref(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class Holder:
        def __init__(self) -> None:
            self.ref = lumos.put(49)

        def plain(self) -> list[Any]:
            return [self.ref]  # a ref inside a value stays a ref

        def bare(self) -> Any:
            return self.ref  # an ObjectRef is awaitable: it must not be awaited for the caller

        async def touch(self) -> None:
            return None

    h = Holder.remote()
    (inner,) = lumos.get(h.plain.remote(), timeout=30)
    bare = lumos.get(h.bare.remote(), timeout=30)
    assert isinstance(bare, lumos.ObjectRef) and bare == inner
    assert lumos.get(bare, timeout=30) == 49


def test_cancel_stops_a_running_async_actor_call(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class Waiter:
        def __init__(self) -> None:
            self.cancelled = 0

        async def wait(self) -> None:
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                self.cancelled += 1
                raise

        async def count(self) -> int:
            return self.cancelled

    w = Waiter.remote()
    ref = w.wait.remote()
    lumos.get(w.count.remote(), timeout=30)  # the wait call has started by now
    t0 = time.monotonic()
    lumos.cancel(ref)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(ref, timeout=30)
    assert time.monotonic() - t0 < 10
    assert lumos.get(w.count.remote(), timeout=30) == 1  # the actor goes on serving


def test_cancel_of_a_sync_actor_call_sets_a_flag_and_drops_queued_calls(cluster: lumos.LumosContext,
                                                                          tmp_path: Any) -> None:
    started = tmp_path / "started"

    @lumos.remote
    class Stepper:
        def __init__(self) -> None:
            self.steps = 0

        def run(self) -> str:
            started.write_text("yes")
            ctx = lumos.get_runtime_context()
            deadline = time.monotonic() + 30
            while not ctx.is_canceled() and time.monotonic() < deadline:
                self.steps += 1  # never interrupted half-way
                time.sleep(0.01)
            self.outcome = "stopped" if ctx.is_canceled() else "timed out"
            return self.outcome

        def steps_done(self) -> int:
            return self.steps

        def last_outcome(self) -> str:
            return self.outcome

    s = Stepper.remote()
    running = s.run.remote()
    queued = s.steps_done.remote()
    wait_for(started.exists, 30)
    with pytest.raises(ValueError, match="force=True"):
        lumos.cancel(running, force=True)
    lumos.cancel(queued)
    lumos.cancel(running)
    # As in Ray: the method ran to its end (it saw the flag), and get() raises.
    with pytest.raises(lumos.exceptions.TaskCancelledError, match=r"Stepper.run\(\) was cancelled while it ran"):
        lumos.get(running, timeout=30)
    assert lumos.get(s.last_outcome.remote(), timeout=30) == "stopped"
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(queued, timeout=30)
    assert lumos.get(s.steps_done.remote(), timeout=30) > 0  # the actor goes on
    with pytest.raises(RuntimeError, match="inside a task"):
        lumos.get_runtime_context().is_canceled()

    @lumos.remote(max_concurrency=2)
    class Threaded:
        def run(self, marker: str) -> str:
            with open(marker, "w") as f:
                f.write("started")
            ctx = lumos.get_runtime_context()
            deadline = time.monotonic() + 30
            while not ctx.is_canceled() and time.monotonic() < deadline:
                time.sleep(0.01)
            return "stopped" if ctx.is_canceled() else "timed out"

        def other(self) -> bool:
            return lumos.get_runtime_context().is_canceled()

    th = Threaded.remote()
    assert lumos.get(th.other.remote(), timeout=30) is False  # (connected: the next call goes out directly)
    marker = tmp_path / "threaded"
    running = th.run.remote(str(marker))
    wait_for(marker.exists, 30)
    with pytest.raises(ValueError, match="force=True"):  # a lone call, which the caller's thread wrote itself
        lumos.cancel(running, force=True)
    lumos.cancel(running)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        lumos.get(running, timeout=30)
    assert lumos.get(th.other.remote(), timeout=30) is False  # the flag is per call


class _AtOnce:
    """Counts the calls of a threaded actor that run at the same moment."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running = self.peak = 0

    def run_for(self, seconds: float) -> None:
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        time.sleep(seconds)
        with self.lock:
            self.running -= 1


def test_concurrency_groups_limit_each_group_on_its_own(cluster: lumos.LumosContext) -> None:
    @lumos.remote(concurrency_groups={"io": 3, "compute": 1})
    class Service:
        def __init__(self) -> None:
            self.running: dict[str, int] = {}
            self.peak: dict[str, int] = {}

        async def _work(self, group: str) -> None:
            self.running[group] = self.running.get(group, 0) + 1
            self.peak[group] = max(self.peak.get(group, 0), self.running[group])
            await asyncio.sleep(0.1)
            self.running[group] -= 1

        @lumos.method(concurrency_group="io")
        async def fetch(self) -> None:
            await self._work("io")

        @lumos.method(concurrency_group="compute")
        async def crunch(self) -> None:
            await self._work("compute")

        async def other(self) -> None:
            await self._work("default")

        async def peaks(self) -> dict[str, int]:
            return dict(self.peak)

    s = Service.remote()
    refs = ([s.fetch.remote() for _ in range(9)] + [s.crunch.remote() for _ in range(3)]
            + [s.other.remote() for _ in range(5)] + [s.other.options(concurrency_group="io").remote()])
    lumos.get(refs, timeout=60)
    peaks = lumos.get(s.peaks.remote(), timeout=30)
    assert peaks["io"] == 3 and peaks["compute"] == 1 and peaks["default"] == 5, peaks
    with pytest.raises(ValueError, match="not defined"):
        lumos.get(s.other.options(concurrency_group="nope").remote(), timeout=30)

    @lumos.remote(concurrency_groups={"slow": 2})  # a sync class: its groups run on threads
    class Threads:
        def __init__(self) -> None:
            self.calls = _AtOnce()

        @lumos.method(concurrency_group="slow")
        def slow(self) -> None:
            self.calls.run_for(0.1)

        def quick(self) -> int:
            return self.calls.peak

    t = Threads.remote()
    pending = [t.slow.remote() for _ in range(6)]
    assert lumos.get(t.quick.remote(), timeout=30) <= 2  # the default group is not behind them
    lumos.get(pending, timeout=60)
    assert lumos.get(t.quick.remote(), timeout=30) == 2
    with pytest.raises(TypeError, match="concurrency_groups"):
        Threads.options(concurrency_groups={"x": 0})


def test_threaded_actor(cluster: lumos.LumosContext) -> None:
    @lumos.remote(max_concurrency=4)
    class Threaded:
        def __init__(self) -> None:
            self.calls = _AtOnce()

        def work(self) -> None:
            self.calls.run_for(0.3)

        def peak_seen(self) -> int:
            return self.calls.peak

    t = Threaded.remote()
    lumos.get([t.work.remote() for _ in range(8)])
    assert lumos.get(t.peak_seen.remote()) == 4


# --------------------------------------------------------------------------- pool, events


def test_actor_pool(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class Doubler:
        def double(self, v: int) -> int:
            time.sleep(0.01 * (v % 3))
            return 2 * v

    pool = ActorPool([Doubler.remote() for _ in range(3)])
    assert list(pool.map(lambda a, v: a.double.remote(v), range(10))) == [2 * v for v in range(10)]
    assert sorted(pool.map_unordered(lambda a, v: a.double.remote(v), range(10))) == [2 * v for v in range(10)]
    for v in range(5):
        pool.submit(lambda a, v: a.double.remote(v), v)
    assert [pool.get_next() for _ in range(5)] == [0, 2, 4, 6, 8]
    assert not pool.has_next()
    with pytest.raises(StopIteration):
        pool.get_next()
    # As in Ray: map() submits everything before it returns.
    results = pool.map(lambda a, v: a.double.remote(v), [1, 2])
    assert pool.has_next() and list(results) == [2, 4]
    assert not ActorPool([]).has_next()


def test_actor_pool_drops_a_dead_actor_and_skips_a_timed_out_result(cluster: lumos.LumosContext) -> None:
    """As in Ray: an actor a call found dead leaves the pool (it went back idle and failed
    every later call); get_next(timeout, ignore_if_timedout=True) skips that result and
    raises TimeoutError (it returned None)."""
    @lumos.remote
    class Worker:
        def work(self, v: float) -> float:
            if v < 0:
                os._exit(1)
            time.sleep(v)
            return v

    pool = ActorPool([Worker.options(max_restarts=0).remote() for _ in range(2)])
    with pytest.raises(ActorDiedError):
        list(pool.map(lambda a, v: a.work.remote(v), [-1, 0, 0]))
    assert list(pool.map(lambda a, v: a.work.remote(v), [0.0, 0.01, 0.02, 0.03])) == [0.0, 0.01, 0.02, 0.03]
    assert len(pool._idle) == 1
    pool.submit(lambda a, v: a.work.remote(v), 1.0)
    pool.submit(lambda a, v: a.work.remote(v), 0.0)
    with pytest.raises(TimeoutError, match="ignored"):
        pool.get_next(timeout=0.1, ignore_if_timedout=True)
    assert pool.get_next(timeout=30) == 0.0 and not pool.has_next()


def test_task_events_for_actor_creation_and_calls(cluster: lumos.LumosContext) -> None:
    c = Counter.remote()
    refs = [c.incr.remote() for _ in range(3)]
    lumos.get(refs)

    def rows() -> list[dict]:
        actor_hex = c._actor_id.hex()
        found = [t for t in lumos.state.list_tasks() if t["actor_id"] == actor_hex]
        done = [t for t in found if t["state"] == "FINISHED" and t["start_time"] and t["end_time"]]
        return found if len(done) == 4 and len(found) == 4 else []

    found = wait_for(rows, 10)
    creation = [t for t in found if t["type"] == "ACTOR_CREATION_TASK"]
    calls = [t for t in found if t["type"] == "ACTOR_TASK"]
    assert len(creation) == 1 and len(calls) == 3
    calls.sort(key=lambda t: t["submitted_time"])
    assert calls[0]["prev_call_task_id"] is None
    assert calls[1]["prev_call_task_id"] == calls[0]["task_id"]
    assert calls[2]["prev_call_task_id"] == calls[1]["task_id"]
    assert all(t["caller_id"] for t in calls)
    assert all(t["start_time"] <= t["end_time"] for t in calls)


def test_exit_actor_from_async_and_threaded_methods(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    class AsyncQuitter:
        async def bye(self) -> None:
            lumos.actor.exit_actor()

    @lumos.remote(max_concurrency=2)
    class ThreadedQuitter:
        def bye(self) -> None:
            lumos.actor.exit_actor()

    for cls in (AsyncQuitter, ThreadedQuitter):
        q = cls.remote()
        with pytest.raises(ActorDiedError, match="exit_actor"):
            lumos.get(q.bye.remote(), timeout=10)


def test_state_lists_actors(cluster: lumos.LumosContext) -> None:
    c = Counter.options(name="listed").remote()
    pid = lumos.get(c.pid.remote())
    rows = [r for r in lumos.state.list_actors() if r["actor_id"] == c._actor_id.hex()]
    assert len(rows) == 1
    row = rows[0]
    assert row["state"] == "ALIVE" and row["class_name"] == "Counter" and row["name"] == "listed"
    assert row["pid"] == pid and row["num_restarts"] == 0
    lumos.kill(c)
    dead = wait_for(lambda: [r for r in lumos.state.list_actors(filters=[("state", "=", "DEAD")])
                             if r["actor_id"] == c._actor_id.hex()], 10)
    assert "lumos.kill" in dead[0]["death_cause"]


def test_max_pending_calls(cluster: lumos.LumosContext) -> None:
    @lumos.remote(max_pending_calls=3)
    class Slow:
        def work(self) -> None:
            time.sleep(0.3)

    s = Slow.remote()
    refs = [s.work.remote() for _ in range(3)]
    with pytest.raises(lumos.exceptions.PendingCallsLimitExceeded, match="max_pending_calls=3"):
        s.work.remote()
    lumos.get(refs)
    lumos.get(s.work.remote())  # room again once they are answered


def test_a_call_that_could_not_be_made_frees_its_max_pending_calls_place(cluster: lumos.LumosContext) -> None:
    import threading

    @lumos.remote(max_pending_calls=2)
    class Echo:
        def echo(self, x: object = None) -> object:
            return x

    e = Echo.remote()
    for _ in range(3):
        with pytest.raises(TypeError, match="cannot be pickled"):
            e.echo.remote(threading.Lock())
    with pytest.raises(TypeError):
        e.echo.remote(1, 2, 3)  # (a wrong call: refused before it is counted)
    assert lumos.get([e.echo.remote(1), e.echo.remote(2)], timeout=20) == [1, 2]


def test_actor_keeps_a_ref_it_was_passed_after_the_caller_drops_it(cluster: lumos.LumosContext) -> None:
    import gc

    import numpy as np

    @lumos.remote
    class Keeper:
        def keep(self, box: list) -> None:
            self.ref = box[0]  # a borrowed ref outlives the call

        def total(self) -> float:
            return float(lumos.get(self.ref).sum())

    k = Keeper.remote()
    ref = lumos.put(np.ones(1_000_000))
    lumos.get(k.keep.remote([ref]))
    del ref
    gc.collect()
    time.sleep(0.5)  # the driver's release would have freed it by now if the borrow were lost
    assert lumos.get(k.total.remote(), timeout=20) == 1_000_000.0


def test_ready_method_and_context_names(cluster: lumos.LumosContext) -> None:
    from lumos.util import placement_group, remove_placement_group
    from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @lumos.remote(num_cpus=0)
    class Who:
        def names(self) -> tuple[Any, Any]:
            ctx = lumos.get_runtime_context()
            return ctx.get_actor_name(), ctx.get_placement_group_id()

    named = Who.options(name="who-is-it").remote()
    assert lumos.get(named.__ray_ready__.remote(), timeout=30) is True
    assert lumos.get(named.names.remote(), timeout=30) == ("who-is-it", None)
    pg = placement_group([{"CPU": 1}])
    assert pg.wait(30)
    inside = Who.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote()
    assert lumos.get(inside.names.remote(), timeout=30) == ("", pg.id.hex())  # unnamed: "", as in Ray
    assert lumos.get_runtime_context().get_actor_name() is None
    lumos.kill(named)
    lumos.kill(inside)
    remove_placement_group(pg)


def test_runtime_context_in_init_and_in_concurrent_calls(cluster: lumos.LumosContext) -> None:
    # In __init__ the context did not know its actor yet (no id, no name, current_actor
    # raised); a threaded or async actor's calls all saw the same task id and name.
    @lumos.remote(num_cpus=0)
    class InInit:
        def __init__(self) -> None:
            ctx = lumos.get_runtime_context()
            self.seen = (ctx.get_actor_id(), ctx.get_actor_name(), type(ctx.current_actor).__name__)

        def seen_in_init(self) -> tuple[Any, ...]:
            return self.seen + (lumos.get_runtime_context().get_actor_id(),)

    actor_id, name, handle_type, later_id = lumos.get(InInit.options(name="ctx-init").remote().seen_in_init.remote(),
                                                      timeout=30)
    assert actor_id == later_id and name == "ctx-init" and handle_type == "ActorHandle"

    @lumos.remote(num_cpus=0)
    class Async:
        async def ids(self, delay: float) -> tuple[Any, ...]:
            await asyncio.sleep(delay)  # the calls interleave on the actor's loop
            ctx = lumos.get_runtime_context()
            return ctx.get_task_id(), ctx.get_task_name(), ctx.get_task_function_name()

    @lumos.remote(num_cpus=0, max_concurrency=3)
    class Threaded:
        def ids(self, delay: float) -> tuple[Any, ...]:
            time.sleep(delay)
            ctx = lumos.get_runtime_context()
            return ctx.get_task_id(), ctx.get_task_name(), ctx.get_task_function_name()

    for cls in (Async, Threaded):
        a = cls.remote()
        refs = [a.ids.remote(0.1 * (3 - i)) for i in range(3)]
        got = lumos.get(refs, timeout=30)
        assert len({task_id for task_id, _, _ in got}) == 3
        assert {name for _, name, _ in got} == {f"{cls.__name__}.ids"}
        assert all(fn.endswith(f"{cls.__name__}.ids") for _, _, fn in got)
        wait_for(lambda: {task_id for task_id, _, _ in got} <= {  # the ids are the task log's
            t["task_id"] for t in lumos.state.list_tasks(filters=[("name", "=", f"{cls.__name__}.ids")])}, 10)


@lumos.remote
class _CallsItself:
    def __init__(self) -> None:
        self.me: Any = None

    def set_me(self, handle: Any) -> None:
        self.me = handle

    def inner(self) -> int:
        return 1

    def waits_for_itself(self) -> int:
        return lumos.get(self.me.inner.remote())

    def hands_back(self) -> Any:
        return self.me.inner.remote()


def test_a_one_at_a_time_actor_waiting_for_its_own_call_raises_instead_of_hanging(
        cluster: lumos.LumosContext) -> None:
    # The awaited call could only run after the waiting one returned (Ray hangs there).
    a = _CallsItself.remote()
    lumos.get(a.set_me.remote(a), timeout=30)
    with pytest.raises(TaskError) as info:
        lumos.get(a.waits_for_itself.remote(), timeout=30)
    assert isinstance(info.value.cause, RuntimeError)
    assert "waits in get() for _CallsItself.inner(), a call to the same actor" in str(info.value)
    assert lumos.get(lumos.get(a.hands_back.remote(), timeout=30), timeout=30) == 1  # the actor is fine
    # An actor that runs calls at once may wait for its own (no error).
    b = _CallsItself.options(max_concurrency=2).remote()
    lumos.get(b.set_me.remote(b), timeout=30)
    assert lumos.get(b.waits_for_itself.remote(), timeout=30) == 1
    lumos.kill(a)
    lumos.kill(b)


@lumos.remote
class _Signatures:
    def __init__(self, start: int, *, step: int = 1) -> None:
        self.value = start
        self.step = step

    def add(self, x: int, y: int = 0) -> int:
        return self.value + x + y

    def many(self, *xs: int, scale: int) -> int:
        return scale * sum(xs)

    @staticmethod
    def double(x: int) -> int:
        return 2 * x

    async def later(self, x: int) -> int:
        return x


@lumos.remote
def _call_through(handle: Any) -> str:
    try:
        handle.add.remote()
    except TypeError as e:
        return str(e)
    return "no error"


def test_actor_calls_with_wrong_arguments_raise_at_the_call(cluster: lumos.LumosContext) -> None:
    # As in Ray: checked against the method's signature when the call is made (they were
    # sent, failed on the actor, and raised from get()).
    with pytest.raises(TypeError, match=r"_Signatures\(\) missing a required argument: 'start'"):
        _Signatures.remote()
    with pytest.raises(TypeError, match="unexpected keyword argument 'stp'"):
        _Signatures.remote(1, stp=2)
    a = _Signatures.remote(10, step=2)
    with pytest.raises(TypeError, match=r"_Signatures.add\(\) missing a required argument: 'x'"):
        a.add.remote()
    with pytest.raises(TypeError, match="too many positional arguments"):
        a.add.remote(1, 2, 3)
    with pytest.raises(TypeError, match="missing a required argument: 'scale'"):
        a.many.remote(1, 2)
    with pytest.raises(TypeError, match="too many positional arguments"):
        a.double.remote(1, 2)
    with pytest.raises(TypeError, match="missing a required argument: 'x'"):
        a.later.remote()
    assert lumos.get([a.add.remote(1), a.add.remote(1, y=5), a.add.remote(x=2), a.many.remote(1, 2, scale=3),
                      a.double.remote(4), a.later.remote(7)], timeout=60) == [11, 16, 12, 9, 8, 7]
    # A handle passed on (and one looked up by name) checks its calls too.
    assert lumos.get(_call_through.remote(a), timeout=60) == \
        "_Signatures.add() missing a required argument: 'x'"
    named = _Signatures.options(name="signatures-test").remote(0)
    try:
        with pytest.raises(TypeError, match="missing a required argument: 'x'"):
            lumos.get_actor("signatures-test").add.remote()
    finally:
        lumos.kill(named)
