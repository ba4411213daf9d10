"""The stop button in the driver: SIGINT (Jupyter's stop, Ctrl-C) landing at any moment
of a ``put`` or a ``.remote()`` with a large argument raises ``KeyboardInterrupt`` there
and leaves nothing behind: no store memory, no object entry, once the refs the user did
get are dropped.

The signals are real (``pthread_kill`` of the main thread, where Python raises
``KeyboardInterrupt``), sent at random moments by another thread, hundreds per test."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
import weakref
from typing import Any, Callable

import numpy as np
import pytest

import lumos
from lumos._private import interrupts, worker_context
from lumos._private.core_worker.objects import RESERVE_MAX_BYTES
from lumos._private.protocol import messages as m
from tests.conftest import TEST_CONFIG, wait_for

pytestmark = pytest.mark.timeout(180)


@lumos.remote
def nbytes(a: Any) -> int:
    return int(a.nbytes)


def _store_used() -> tuple[int, int]:
    """Bytes and number of the objects in this node's store (slots kept for reuse or
    reserved ahead by a process are not objects)."""
    st = worker_context.require().call_raylet(m.GetNodeStats())["store"]
    return int(st["used_bytes"] - st["pool_bytes"] - st["reserved_bytes"]), int(st["num_objects"])


def _interrupted_often(op: Callable[[], Any], ops: int, seed: int, every_s: float,
                       keep: bool = True, at_least: int = 0, finished_at_least: int = 0) -> tuple[list[Any], int]:
    """Run ``op`` ``ops`` times while another thread sends SIGINT to this (the main)
    thread every 0-``every_s`` seconds while an op is under way. Returns what the ops
    that finished returned, and how many were interrupted. (What finished is kept until
    the end: a ref dropped here would be dropped under fire too, which is not what is
    tested; ``keep=False`` drops each before the next op, outside the fire, so that the
    next op frees it under fire.) No signal is sent once an op is over (``gate``), and
    one sent just before lands in the loop's own ``try``. One that landed in a finalizer
    comes again a moment later (``interrupts.resend_later``), wherever the loop is then:
    the whole loop is in a ``try``, and it ends with a pause for it. ``at_least``: more
    ops (up to four times ``ops``) until that many were interrupted, since how many
    shots land depends on how long an op takes on the machine at the time. The shooter
    needs the GIL to shoot, which a busy main thread gives up only every switch interval
    (5 ms by default): that is shortened to half ``every_s`` meanwhile, or the shots come
    every 5 ms whatever ``every_s`` says, and mostly while no op is under way (the main
    thread's pause between ops gives the GIL up at once). ``finished_at_least``: likewise
    until that many ops finished; when an op takes longer than ``every_s`` on a slow
    machine nearly every one is shot, so after each ``ops`` ops short of it the shots
    come twice as far apart."""
    busy = threading.Event()
    stop = threading.Event()
    gate = threading.Lock()

    spacing = [every_s]

    def shoot() -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            time.sleep(rng.random() * spacing[0])
            with gate:
                if busy.is_set():
                    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]

    got: list[Any] = []
    interrupted = 0
    shooter = threading.Thread(target=shoot, daemon=True)
    switch_s = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_s, every_s / 2))
    shooter.start()

    def finished() -> bool:
        return done >= ops and ((interrupted >= at_least and ok >= finished_at_least) or done >= 4 * ops)

    done = ok = 0
    try:
        while not finished():
            try:
                if not keep:
                    got.clear()
                if done and done % ops == 0 and ok < finished_at_least:
                    spacing[0] *= 2
                _held(busy.set)
                done += 1
                got.append(op())
                ok += 1
            except KeyboardInterrupt:
                interrupted += 1
            while True:
                try:
                    _held(lambda: _locked(gate, busy.clear))
                    time.sleep(0.001)  # (a signal sent before the clear is handled in here)
                    if finished():
                        time.sleep(0.6)  # (and one sent again: up to 10 tries, 50 ms apart in client mode)
                    break
                except KeyboardInterrupt:
                    interrupted += 1
    finally:
        stop.set()
        shooter.join(5)
        sys.setswitchinterval(switch_s)
    return got, interrupted


def _held(step: Callable[[], Any]) -> None:
    """``step`` with SIGINT held off (``interrupts.hold``), raised after it if one came.
    A ``KeyboardInterrupt`` that lands just after a ``with lock:`` took its lock (the
    gate's, or the one inside an ``Event``) leaves the lock taken for good: the loop's
    next ``with`` on it waits forever (the suite saw it once presses came every 0.1 ms)."""
    held = interrupts.hold()
    try:
        step()
    finally:
        if held:
            interrupts.release()


def _locked(lock: threading.Lock, step: Callable[[], Any]) -> None:
    with lock:
        step()


def _settles_to(store: tuple[int, int], entries: int) -> None:
    cw = worker_context.require()

    def settled() -> bool:
        cw.drain_refs()
        now = _store_used()
        return now[0] <= store[0] and now[1] <= store[1] and len(cw.objects.entries) <= entries

    try:
        wait_for(settled, 20)
    except AssertionError:
        (now_bytes, now_objects), (bytes0, objects0) = _store_used(), store
        raise AssertionError(f"{now_objects - objects0} objects ({now_bytes - bytes0} bytes) more in the store "
                             f"than at the start, {len(cw.objects.entries) - entries} object entries more") from None


@pytest.mark.parametrize("size,keep", [(1 << 20, True), (RESERVE_MAX_BYTES + (1 << 20), True), (1 << 20, False)],
                         ids=["reserved slot", "created", "each freed by the next"])
def test_puts_stopped_at_random_moments_leave_nothing_behind(fresh_cluster, size: int, keep: bool) -> None:
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    value = np.ones(size // 8)
    lumos.get(lumos.put(value), timeout=30)  # (the store's slots of that size reserved)
    time.sleep(0.5)
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, interrupts._on_sigint)
    cw = worker_context.require()
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    big = size > RESERVE_MAX_BYTES  # (a put of ~5-10 ms: a signal every 0-30 ms; of 1 MiB, ~0.3 ms: 0-2 ms)
    refs, interrupted = _interrupted_often(lambda: lumos.put(value), 30 if big else 200, 1, 0.03 if big else 0.002,
                                           keep, at_least=5)
    assert interrupted >= 5, interrupted
    assert all(lumos.get(r, timeout=30).nbytes == value.nbytes for r in refs[-3:])
    del refs
    _settles_to(store0, entries0)
    lumos.get(lumos.put(value), timeout=30)  # the store works on


def test_calls_with_a_large_argument_stopped_at_random_moments_leave_nothing_behind(fresh_cluster) -> None:
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    value = np.ones((1 << 20) // 8)
    assert lumos.get(nbytes.remote(value), timeout=30) == value.nbytes
    time.sleep(0.5)
    cw = worker_context.require()
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    refs, interrupted = _interrupted_often(lambda: nbytes.remote(value), 200, 2, 0.002, at_least=10,
                                           finished_at_least=10)
    assert interrupted >= 10 and len(refs) >= 10, (interrupted, len(refs))
    assert lumos.get(refs, timeout=60) == [value.nbytes] * len(refs)
    del refs
    _settles_to(store0, entries0)


def test_a_stop_held_off_by_lumos_is_raised_once_its_step_is_whole() -> None:
    """``interrupts.hold`` / ``release`` on their own: a SIGINT during the hold raises at
    the release, once; none during it raises nothing; outside a hold it raises at once."""
    assert signal.getsignal(signal.SIGINT) in (signal.default_int_handler, interrupts._on_sigint)
    main = threading.main_thread().ident
    assert interrupts.hold()
    signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
    time.sleep(0.01)  # (handled meanwhile, and held)
    with pytest.raises(KeyboardInterrupt):
        interrupts.release()
    assert interrupts.hold()
    interrupts.release()  # nothing pending: nothing raised
    with pytest.raises(KeyboardInterrupt):
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
        time.sleep(1)
    # A window whose __exit__ was stopped before its first line left the depth at 0: the
    # stretch's release does not take it below, and holds work on.
    assert interrupts.hold()
    interrupts._depth = 0
    interrupts.release()
    assert interrupts._depth == 0 and interrupts.hold()
    signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
    time.sleep(0.01)
    with pytest.raises(KeyboardInterrupt):
        interrupts.release()
    # Off the main thread nothing is held (SIGINT never raises there).
    out: list[bool] = []
    t = threading.Thread(target=lambda: out.append(interrupts.hold()))
    t.start()
    t.join()
    assert out == [False]


@lumos.remote(num_cpus=0)
class _Kept:
    def ok(self) -> int:
        return 1


def test_an_actor_asked_for_as_the_stop_button_is_pressed_ends_with_its_dropped_handle(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The press lands just after the actor was asked for, before its handle was made:
    the handle is made, dropped with the KeyboardInterrupt, and ends the actor (without
    one, the actor lived, unreachable, until the job ended)."""
    from lumos._private.core_worker.core_worker import CoreWorker
    fresh_cluster(num_cpus=1)
    real = CoreWorker.create_actor

    def pressed_after(self: CoreWorker, *args: Any, **kwargs: Any) -> Any:
        info = real(self, *args, **kwargs)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # type: ignore[arg-type]
        time.sleep(0.05)  # (the handler runs in here)
        return info

    monkeypatch.setattr(CoreWorker, "create_actor", pressed_after)
    with pytest.raises(KeyboardInterrupt):
        _Kept.remote()
    monkeypatch.setattr(CoreWorker, "create_actor", real)

    def states() -> list[str]:
        return [a["state"] for a in lumos.state.list_actors() if a["class_name"] == "_Kept"]

    wait_for(lambda: states() == ["DEAD"], 30)  # (it was created: PENDING_CREATION or ALIVE first)
    assert lumos.get(_Kept.remote().ok.remote(), timeout=30) == 1


def test_a_stop_pressed_as_dropped_refs_are_freed_loses_no_free(fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The press lands after the next call took the dropped refs' entries away and before
    it sent their frees (``drain_refs``): the frees still go, then the call stops. (It
    left the values in the store for the driver's life.)"""
    from lumos._private.core_worker.core_worker import CoreWorker
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    cw = worker_context.require()
    lumos.get(lumos.put(np.ones(16)), timeout=30)
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    ref = lumos.put(np.ones((1 << 20) // 8))
    assert _store_used()[1] == store0[1] + 1
    real = CoreWorker._release
    main = threading.main_thread().ident
    armed = [True]

    def pressed_first(self: CoreWorker, freed: Any) -> None:
        if armed[0] and threading.get_ident() == main:
            armed[0] = False
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
            time.sleep(0.05)  # (the handler runs in here)
        real(self, freed)

    monkeypatch.setattr(CoreWorker, "_release", pressed_first)
    del ref
    with pytest.raises(KeyboardInterrupt):
        lumos.put(1)  # (its drain_refs frees the dropped value)
    monkeypatch.setattr(CoreWorker, "_release", real)
    assert not armed[0]
    _settles_to(store0, entries0)


@lumos.remote
def _filled(i: int) -> Any:
    return np.full((1 << 20) // 8, float(i))


def test_gets_stopped_at_random_moments_leave_nothing_pinned(fresh_cluster) -> None:
    """Presses while ``get`` maps values out of the store (between the pin a view counts
    and the weakref that gives it back), and while the previous value's view goes (its
    weakref callback): every value is unpinned once dropped, and freed with its ref. (The
    value stayed pinned, in the store, for the driver's life.)"""
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    lumos.get(_filled.remote(0), timeout=30)
    cw = worker_context.require()
    time.sleep(0.5)
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    refs = [_filled.remote(i) for i in range(50)]
    lumos.wait(refs, num_returns=len(refs), timeout=60)
    order = iter(range(10**9))

    def gets() -> Any:  # (ten in a row: each drops the value before it under fire too)
        x = None
        for _ in range(10):
            x = lumos.get(refs[next(order) % 50])
        return x

    got, interrupted = _interrupted_often(gets, 2500, 4, 0.0002, keep=False, at_least=3)
    assert interrupted >= 3, interrupted
    del got, refs
    _settles_to(store0, entries0)


class _SlowToGo:
    """A finalizer of lumos's stand-in: ``__del__`` takes ``seconds`` and notes that it
    ran to its end."""

    ended: list[int] = []

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    @interrupts.finalizer
    def __del__(self) -> None:
        t = time.perf_counter() + self.seconds
        while time.perf_counter() < t:
            pass
        _SlowToGo.ended.append(1)


def test_a_stop_pressed_in_a_finalizer_is_raised_after_it(fresh_cluster) -> None:
    """A SIGINT that lands while one of lumos's finalizers runs (Python would only print
    a KeyboardInterrupt raised there, the finalizer half done and the press lost) lets
    the finalizer end, then raises in the code that dropped the object."""
    fresh_cluster(num_cpus=1)
    lumos.get(lumos.put(1), timeout=30)  # (lumos's handler in place, the io thread up)
    assert signal.getsignal(signal.SIGINT) is interrupts._on_sigint
    main = threading.main_thread().ident
    _SlowToGo.ended.clear()
    timer = threading.Timer(0.05, signal.pthread_kill, (main, signal.SIGINT))
    obj = _SlowToGo(0.3)
    timer.start()
    t0 = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        del obj  # (the press lands in __del__, 50 ms into its 300)
        time.sleep(5)
    assert _SlowToGo.ended == [1]
    assert 0.3 <= time.perf_counter() - t0 < 4
    timer.join()
    # Outside a finalizer, a press raises at once, as always.
    with pytest.raises(KeyboardInterrupt):
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
        time.sleep(1)


class _Weak:
    pass


def test_a_stop_pressed_in_a_weakset_removal_is_raised_after_it(fresh_cluster) -> None:
    """A press landing in the standard library's weakref callbacks (``WeakSet``'s, which
    asyncio's task registry runs in the main thread when a ``run_sync`` drops a done
    task there) is raised after it, as in lumos's own finalizers: it was printed and
    lost (a kernel's cell looped on), the set's entry left dead."""
    fresh_cluster(num_cpus=1)
    lumos.get(lumos.put(1), timeout=30)  # (lumos's handler in place, the io thread up)
    assert signal.getsignal(signal.SIGINT) is interrupts._on_sigint
    objs = [_Weak() for _ in range(1_000_000)]
    members = weakref.WeakSet(objs)
    timer = threading.Timer(0.02, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    t0 = time.perf_counter()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        del objs  # (a million removals from the set, each a Python callback: the press lands in one)
        time.sleep(5)
    timer.join()
    assert time.perf_counter() - t0 < 4
    assert len(members.data) == 0  # no removal was left half done


class _StopsWhenPickled:
    """An argument whose pickling is stopped (a press landing as the call's arguments
    are pickled, made certain)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt


@lumos.remote(num_cpus=0, max_pending_calls=1)
class _OneAtATime:
    def work(self, x: Any = None, seconds: float = 0.0) -> Any:
        time.sleep(seconds)
        return x


def test_an_actor_call_stopped_before_it_is_made_gives_back_its_max_pending_calls_place(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A press as the arguments are pickled: the call is not made and its place is free
    again (kept, one such press locked a ``max_pending_calls=1`` actor out for good). A
    press as the call is handed over raises once it is made: that call runs and keeps its
    place until it is answered."""
    from lumos._private.core_worker.actor_submitter import ActorSubmitter
    fresh_cluster(num_cpus=1)
    a = _OneAtATime.remote()
    assert lumos.get(a.work.remote(1), timeout=30) == 1
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            a.work.remote(_StopsWhenPickled())
    assert lumos.get(a.work.remote(2), timeout=30) == 2

    real = ActorSubmitter.send_direct
    main = threading.main_thread().ident

    def pressed(self: ActorSubmitter, task: Any) -> Any:
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
        time.sleep(0.05)  # (the handler runs in here, held)
        return real(self, task)

    monkeypatch.setattr(ActorSubmitter, "send_direct", pressed)
    with pytest.raises(KeyboardInterrupt):
        a.work.remote(3, 1.0)
    monkeypatch.setattr(ActorSubmitter, "send_direct", real)
    with pytest.raises(lumos.exceptions.PendingCallsLimitExceeded):
        a.work.remote(4)  # (the call made above is still running)
    wait_for(lambda: _answers(a), 20)


def _answers(a: Any) -> bool:
    try:
        return bool(lumos.get(a.work.remote(5), timeout=20) == 5)
    except lumos.exceptions.PendingCallsLimitExceeded:
        return False


@lumos.remote(num_cpus=0)
class _Named:
    def __init__(self, arr: Any) -> None:
        self.total = float(arr.sum())

    def sum(self) -> float:
        return self.total


def test_a_named_actor_whose_registration_the_stop_button_left_ends_unless_detached(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The press lands while a named actor's creation waits for the GCS: the creation
    raises KeyboardInterrupt, and the registration, which goes on, makes an actor that
    no handle holds. It ends as a dropped handle would end it (it lived until the job
    ended); a detached one stays, its arguments intact, for ``get_actor``."""
    from lumos._private.core_worker.core_worker import CoreWorker
    fresh_cluster(num_cpus=1)
    real = CoreWorker._gcs_call
    main = threading.main_thread().ident

    async def slow_register(self: CoreWorker, msg: Any, timeout_s: Any) -> Any:
        if type(msg).__name__ == "RegisterActor":
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
            await asyncio.sleep(0.3)  # (the press stops the wait meanwhile)
        return await real(self, msg, timeout_s)

    monkeypatch.setattr(CoreWorker, "_gcs_call", slow_register)
    arr = np.ones((1 << 20) // 8)  # (by value: its pin must go to the actor, not be dropped)
    for name, detached in (("left", False), ("kept", True)):
        made: list[Any] = []
        with pytest.raises(KeyboardInterrupt):
            made.append(_Named.options(name=name, lifetime="detached" if detached else None).remote(arr))
        assert not made  # (the press landed in the wait for the GCS)
    monkeypatch.setattr(CoreWorker, "_gcs_call", real)

    def state(name: str) -> list[str]:
        return [a["state"] for a in lumos.state.list_actors() if a.get("name") == name]

    wait_for(lambda: state("left") == ["DEAD"], 30)
    wait_for(lambda: state("kept") == ["ALIVE"], 30)  # (its registration goes on after the press)
    kept = lumos.get_actor("kept")
    assert lumos.get(kept.sum.remote(), timeout=30) == arr.sum()
    lumos.kill(kept)


def test_a_named_actor_whose_registration_the_stop_button_left_and_the_gcs_refused_unpins_its_arguments(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The press lands while a named actor's creation waits for the GCS, which then
    refuses it (the name is taken by a live actor): the creation raises
    KeyboardInterrupt, not ActorAlreadyExistsError, and the by-value argument put into
    the store for it is unpinned and freed (with no one to hear the refusal, it stayed
    pinned, in the store, for the driver's life)."""
    from lumos._private.core_worker.core_worker import CoreWorker
    from lumos._private.transport.connection import RemoteError
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    arr = np.ones((1 << 20) // 8)  # (by value: put into the store, pinned for the creation task)
    first = _Named.options(name="taken").remote(arr)
    assert lumos.get(first.sum.remote(), timeout=30) == arr.sum()
    cw = worker_context.require()
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    real = CoreWorker._gcs_call
    main = threading.main_thread().ident
    entries_in_wait: list[int] = []
    refused: list[str] = []

    async def slow_register(self: CoreWorker, msg: Any, timeout_s: Any) -> Any:
        if type(msg).__name__ != "RegisterActor":
            return await real(self, msg, timeout_s)
        entries_in_wait.append(len(self.objects.entries))
        signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # (the press stops the wait meanwhile)
        try:
            return await real(self, msg, timeout_s)
        except RemoteError as e:
            refused.append(e.type_name)
            raise

    monkeypatch.setattr(CoreWorker, "_gcs_call", slow_register)
    made: list[Any] = []
    with pytest.raises(KeyboardInterrupt) as raised:
        made.append(_Named.options(name="taken").remote(arr))
    assert raised.type is KeyboardInterrupt and not made  # (the press landed in the wait for the GCS)
    del raised  # (its traceback holds create_actor's frame, and the argument's ref in it)
    assert entries_in_wait and entries_in_wait[0] > entries0  # (the argument was pinned meanwhile)
    wait_for(lambda: bool(refused), 20)
    monkeypatch.setattr(CoreWorker, "_gcs_call", real)
    assert refused == ["ActorNameTaken"]
    _settles_to(store0, entries0)
    assert lumos.get(first.sum.remote(), timeout=30) == arr.sum()  # (the name's owner lives on)


def _pressed_after(real: Callable[..., Any], wanted: Callable[[tuple[Any, ...]], bool]) -> Callable[..., Any]:
    """``real``, with a press sent as it returns when ``wanted(args)``: the press lands
    after the answer came and before the caller holds it (lumos's handler raises it at
    the next bytecode, here)."""
    main = threading.main_thread().ident

    def call(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if wanted(args):
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
            time.sleep(1)  # (raised in here)
            raise AssertionError("the press was not raised")
        return out
    return call


def test_a_press_just_after_the_store_granted_a_put_gives_the_grant_back(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """A put too large for the slots reserved ahead asks the raylet to create its
    object. A press that lands once the answer is back, before the put holds it, gives
    the created object back: it stayed in the store, never sealed, for the driver's life
    (the suite's stop-button loop in a kernel met it about once in a thousand presses)."""
    fresh_cluster(num_cpus=1, object_store_memory=1 << 30)
    value = np.ones((RESERVE_MAX_BYTES + (1 << 20)) // 8)
    lumos.get(lumos.put(value), timeout=30)
    cw = worker_context.require()
    cw.drain_refs()
    store0, entries0 = _store_used(), len(cw.objects.entries)
    monkeypatch.setattr(cw, "call_raylet", _pressed_after(cw.call_raylet, lambda a: isinstance(a[0], m.CreateObject)))
    for _ in range(3):
        with pytest.raises(KeyboardInterrupt):
            lumos.put(value)
    monkeypatch.undo()
    _settles_to(store0, entries0)
    assert lumos.get(lumos.put(value), timeout=30).nbytes == value.nbytes  # the store works on


def test_a_press_just_after_a_named_actor_registered_ends_it_unless_detached(
        fresh_cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The press lands once the GCS answered a named actor's registration, before its
    creation holds the answer: as a press during the wait, the actor no handle holds
    ends (a detached one stays); before, it lived until the job ended."""
    fresh_cluster(num_cpus=1)
    cw = worker_context.require()
    monkeypatch.setattr(cw, "run_sync", _pressed_after(cw.run_sync, lambda a: getattr(a[0], "__name__", "") == "register"))
    arr = np.ones((1 << 20) // 8)
    for name, detached in (("left", False), ("kept", True)):
        with pytest.raises(KeyboardInterrupt):
            _Named.options(name=name, lifetime="detached" if detached else None).remote(arr)
    monkeypatch.undo()

    def state(name: str) -> list[str]:
        return [a["state"] for a in lumos.state.list_actors() if a.get("name") == name]

    def gone(name: str) -> bool:
        try:
            lumos.get_actor(name)
        except ValueError:
            return state(name) in ([], ["DEAD"])  # (ended before it was made leaves no row)
        return False

    wait_for(lambda: gone("left"), 30)
    wait_for(lambda: state("kept") == ["ALIVE"], 30)
    kept = lumos.get_actor("kept")
    assert lumos.get(kept.sum.remote(), timeout=30) == arr.sum()
    lumos.kill(kept)


def test_a_press_that_leaves_a_window_holds_the_stretch_around_it_again() -> None:
    """A press raised inside an ``interrupts.Window`` (a wait inside a held stretch)
    holds the stretch around the window again at once: landing as the window's
    ``__exit__`` began, before its first line, it left the rest of the stretch unheld,
    and a second press could stop it half done."""
    assert interrupts.hold()
    try:
        window = interrupts.Window()
        window.__enter__()
        assert interrupts._depth == 0  # (a press raises in the window)
        with pytest.raises(KeyboardInterrupt):
            interrupts._on_sigint(signal.SIGINT, sys._getframe())  # (as lumos's handler runs for a press)
        assert interrupts._depth == 1  # held again, before any of __exit__ ran
        window.__exit__(KeyboardInterrupt, None, None)  # (when it does run: nothing more to do)
        assert interrupts._depth == 1 and not interrupts._windows
    finally:
        interrupts.release()
    assert interrupts._depth == 0


def test_asyncio_run_after_lumos_handler_cancels_its_main_task_as_python_does() -> None:
    """``asyncio.run`` puts its own SIGINT handler in place only over Python's default; one
    started after lumos's first hold (a script's first put or call) found lumos's. A press
    then raised ``KeyboardInterrupt`` wherever the loop was, inside the coroutine's own
    code; as with Python's default, the main task is cancelled instead (the coroutine sees
    ``CancelledError`` at its next await) and ``asyncio.run`` raises ``KeyboardInterrupt``."""
    main = threading.main_thread().ident
    interrupts.install()
    assert interrupts.is_ours(signal.getsignal(signal.SIGINT))
    seen: list[str] = []

    async def busy() -> None:
        try:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:  # (no await: the press lands in this loop)
                pass
            seen.append("loop ended")
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGINT))
    timer.start()
    t = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(busy())
    finally:
        timer.cancel()
    assert seen == ["loop ended", "cancelled"] and time.monotonic() - t < 10
    assert interrupts.is_ours(signal.getsignal(signal.SIGINT))  # (asyncio.run left it in place)


def test_a_press_held_inside_asyncio_run_cancels_its_main_task_at_the_release() -> None:
    """A press held off inside an ``asyncio.run`` that left SIGINT to lumos (a put in the
    coroutine) comes at the stretch's end as that runner's handler would have it: the
    main task cancelled, ``asyncio.run`` raising ``KeyboardInterrupt``."""
    main = threading.main_thread().ident
    interrupts.install()
    seen: list[str] = []

    async def putting() -> None:
        try:
            assert interrupts.hold()
            signal.pthread_kill(main, signal.SIGINT)  # type: ignore[arg-type]
            time.sleep(0.01)  # (handled meanwhile, and held)
            interrupts.release()  # (the task is cancelled: nothing raised here)
            seen.append("released")
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(putting())
    assert seen == ["released", "cancelled"] and interrupts._depth == 0


def test_a_second_press_inside_asyncio_run_raises_at_once_as_asyncio_does() -> None:
    """The first press under such an ``asyncio.run`` cancels its main task; a second,
    before the task has ended, raises ``KeyboardInterrupt`` where it lands (asyncio's
    own handler does the same for a coroutine that does not stop)."""
    interrupts.install()
    seen: list[str] = []

    async def stubborn() -> None:
        interrupts._on_sigint(signal.SIGINT, sys._getframe())  # (as lumos's handler runs for a press)
        seen.append("first: cancelled, nothing raised")
        try:
            interrupts._on_sigint(signal.SIGINT, sys._getframe())
        except KeyboardInterrupt:
            seen.append("second: raised")
            raise

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(stubborn())
    assert seen == ["first: cancelled, nothing raised", "second: raised"] and interrupts._depth == 0


_PROMPT_SESSION = r'''
import lumos, numpy as np, time
from lumos._private import worker_context
from lumos._private.protocol import messages as m
_ = lumos.init(num_cpus=2, object_store_memory=200 * 1024 * 1024, _system_config=CONFIG)
objects = lambda: worker_context.require().call_raylet(m.GetNodeStats())["store"]["num_objects"]
slow = lumos.remote(lambda: time.sleep(30))
before = objects()
big = lumos.put(np.ones(1 << 20))
slow_ref = slow.remote()
print("waiting", flush=True); lumos.get([big, slow_ref])
'''

_AFTER_THE_PRESS = r'''
del big, slow_ref
deadline = time.monotonic() + 20
while objects() > before and time.monotonic() < deadline: time.sleep(0.05)

print("objects", objects() - before, flush=True)
lumos.shutdown()
'''


@pytest.mark.slow
def test_at_pythons_prompt_a_stopped_get_keeps_no_ref_once_the_user_drops_it(tmp_path: Any) -> None:
    """``python -i``: Ctrl-C in ``lumos.get([big, slow])``, then ``del big``. The prompt
    keeps the last error (``sys.last_traceback``) and every frame on it: lumos.get's held
    the list, and ``big``'s value in the store, until the next error. lumos's hook clears
    lumos's frames once the error is shown."""
    env = dict(os.environ)
    env.pop("LUMOS_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-i", "-q"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=str(tmp_path))
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(f"CONFIG = {TEST_CONFIG!r}\n" + _PROMPT_SESSION)
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "waiting"
        time.sleep(0.5)  # (the get is waiting on slow by then)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(_AFTER_THE_PRESS, timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "KeyboardInterrupt" in err, err
    assert "objects 0" in out, out + err
