"""``lumos.util.queue``: FIFO order, limits, blocking with timeouts, batches, sharing
across tasks and actors, async use, ObjectRef items, shutdown and bad arguments."""

from __future__ import annotations

import asyncio
import pickle
import queue as stdlib_queue
import threading
import time
from typing import Any

import pytest

import lumos
from lumos.exceptions import ActorDiedError
from lumos.util.queue import Empty, Full, Queue

pytestmark = pytest.mark.timeout(60)


@lumos.remote
def put_all(q: Queue, items: list[Any]) -> int:
    for item in items:
        q.put(item, timeout=20)
    return len(items)


@lumos.remote
def get_one(q: Queue, started: Queue) -> Any:
    started.put("started")
    return q.get(timeout=30)


@lumos.remote
def put_one(q: Queue, item: Any, started: Queue) -> None:
    started.put("started")
    q.put(item, timeout=30)


@lumos.remote
def square(x: int) -> int:
    return x * x


@lumos.remote
def get_and_resolve(q: Queue) -> Any:
    ref = q.get(timeout=20)
    return (type(ref).__name__, lumos.get(ref, timeout=20))


@lumos.remote
def get_or_report(q: Queue, started: Queue) -> str:
    started.put("started")
    try:
        q.get(timeout=30)
    except ActorDiedError:
        return "actor died"
    return "got an item"


@lumos.remote(num_cpus=0)
class Consumer:
    def drain(self, q: Queue, n: int) -> list[Any]:
        return [q.get(timeout=20) for _ in range(n)]


@lumos.remote(num_cpus=0)
class AsyncRelay:
    async def relay(self, source: Queue, sink: Queue, n: int) -> int:
        for _ in range(n):
            item = await source.get_async(timeout=20)
            await sink.put_async(item * 10, timeout=20)
        return n

    async def try_get(self, q: Queue, block: bool, timeout: float | None) -> str:
        try:
            return str(await q.get_async(block=block, timeout=timeout))
        except Empty:
            return "empty"

    async def try_put(self, q: Queue, item: Any, block: bool, timeout: float | None) -> str:
        try:
            await q.put_async(item, block=block, timeout=timeout)
        except Full:
            return "full"
        return "put"


# --------------------------------------------------------------------------- basics


def test_items_come_out_in_fifo_order(cluster: lumos.LumosContext) -> None:
    q = Queue()
    for i in range(20):
        q.put(i)
    assert [q.get(timeout=10) for _ in range(20)] == list(range(20))
    q.put_nowait("a")
    q.put_nowait_batch(["b", "c"])
    q.put("d", block=False)
    assert q.get_nowait() == "a"
    assert q.get_nowait_batch(2) == ["b", "c"]
    assert q.get(block=False) == "d"


def test_size_empty_and_full_track_items(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=2)
    assert (len(q), q.size(), q.qsize(), q.empty(), q.full()) == (0, 0, 0, True, False)
    q.put(1)
    assert (len(q), q.size(), q.qsize(), q.empty(), q.full()) == (1, 1, 1, False, False)
    q.put(2)
    assert (len(q), q.empty(), q.full()) == (2, False, True)
    q.get_nowait()
    assert (len(q), q.full()) == (1, False)

    for unbounded in (Queue(), Queue(maxsize=-1)):
        unbounded.put_nowait_batch(range(50))
        assert len(unbounded) == 50
        assert not unbounded.full()


def test_nowait_raises_full_and_empty_at_once(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=1)
    with pytest.raises(Empty, match="empty"):
        q.get_nowait()
    start = time.monotonic()
    with pytest.raises(Empty):
        q.get(block=False, timeout=30)  # the timeout is ignored without blocking
    q.put_nowait("x")
    with pytest.raises(Full, match="maxsize=1"):
        q.put_nowait("y")
    with pytest.raises(Full):
        q.put("y", block=False, timeout=30)
    assert time.monotonic() - start < 10
    # Ray's classes subclass the stdlib ones; these are the plain exceptions, not the
    # actor's wrapped error.
    with pytest.raises(stdlib_queue.Full) as info:
        q.put_nowait("y")
    assert type(info.value) is Full
    assert q.get_nowait() == "x"


def test_get_with_zero_timeout_returns_a_ready_item(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=1)
    q.put("ready", timeout=0)
    assert q.get(timeout=0) == "ready"
    with pytest.raises(Empty):
        q.get(timeout=0)


# --------------------------------------------------------------------------- batches


def test_put_nowait_batch_is_all_or_nothing(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=3)
    q.put(0)
    with pytest.raises(Full, match="none were put"):
        q.put_nowait_batch([1, 2, 3])
    assert len(q) == 1
    q.put_nowait_batch(i for i in (1, 2))  # any iterable, generators too
    assert q.full()
    q.put_nowait_batch([])
    assert q.get_nowait_batch(3) == [0, 1, 2]


def test_get_nowait_batch_is_all_or_nothing(cluster: lumos.LumosContext) -> None:
    q = Queue()
    q.put_nowait_batch(["a", "b"])
    with pytest.raises(Empty, match="none were taken"):
        q.get_nowait_batch(3)
    assert len(q) == 2
    assert q.get_nowait_batch(0) == []
    assert q.get_nowait_batch(2) == ["a", "b"]
    assert q.empty()


# --------------------------------------------------------------------------- blocking


def test_get_with_timeout_raises_empty_after_the_timeout(cluster: lumos.LumosContext) -> None:
    q = Queue()
    start = time.monotonic()
    with pytest.raises(Empty, match="0.5s"):
        q.get(timeout=0.5)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 10, elapsed


def test_put_with_timeout_raises_full_after_the_timeout(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=1)
    q.put("first")
    start = time.monotonic()
    with pytest.raises(Full):
        q.put("second", timeout=0.5)
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed < 10, elapsed
    assert q.get_nowait_batch(1) == ["first"]  # the timed-out put left nothing behind


def test_blocked_get_is_released_by_a_put_from_another_task(cluster: lumos.LumosContext) -> None:
    q, started = Queue(), Queue()
    getter = get_one.remote(q, started)
    assert started.get(timeout=30) == "started"
    ready, _ = lumos.wait([getter], timeout=0.5)
    assert not ready, "get() returned from an empty queue"
    lumos.get(put_one.remote(q, "wake", started), timeout=30)
    assert lumos.get(getter, timeout=30) == "wake"
    assert q.empty()


def test_full_queue_blocks_put_until_a_get(cluster: lumos.LumosContext) -> None:
    q, started = Queue(maxsize=1), Queue()
    q.put("first")
    putter = put_one.remote(q, "second", started)
    assert started.get(timeout=30) == "started"
    ready, _ = lumos.wait([putter], timeout=0.5)
    assert not ready, "put() returned while the queue was full"
    assert q.get(timeout=10) == "first"
    lumos.get(putter, timeout=30)
    assert q.get(timeout=10) == "second"


def test_blocked_getters_are_served_in_the_order_they_waited(cluster: lumos.LumosContext) -> None:
    q = Queue()

    async def main() -> list[Any]:
        getters = [asyncio.ensure_future(q.get_async(timeout=30)) for _ in range(5)]
        await asyncio.sleep(0.3)
        assert not any(g.done() for g in getters)
        for i in range(5):
            await q.put_async(i)
        return await asyncio.gather(*getters)

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- sharing


def test_producer_task_and_consumer_actor_share_one_queue(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=4)  # smaller than the item count: the producer must wait for the consumer
    consumer = Consumer.remote()
    drained = consumer.drain.remote(q, 12)
    produced = put_all.remote(q, list(range(12)))
    assert lumos.get(produced, timeout=30) == 12
    assert lumos.get(drained, timeout=30) == list(range(12))
    assert q.empty()


def test_queue_pickles_to_a_handle_on_the_same_items(cluster: lumos.LumosContext) -> None:
    q = Queue(maxsize=5)
    copy = pickle.loads(pickle.dumps(q))
    copy.put("via copy")
    assert q.get(timeout=10) == "via copy"
    assert copy.maxsize == 5


def test_async_actor_uses_get_async_and_put_async(cluster: lumos.LumosContext) -> None:
    source, sink = Queue(), Queue(maxsize=1)
    relay = AsyncRelay.remote()
    done = relay.relay.remote(source, sink, 3)
    for i in range(1, 4):
        source.put(i)
        assert sink.get(timeout=20) == i * 10
    assert lumos.get(done, timeout=20) == 3

    assert lumos.get(relay.try_get.remote(source, False, None), timeout=20) == "empty"
    start = time.monotonic()
    assert lumos.get(relay.try_get.remote(source, True, 0.3), timeout=20) == "empty"
    assert time.monotonic() - start >= 0.25
    sink.put("occupied")
    assert lumos.get(relay.try_put.remote(sink, "x", False, None), timeout=20) == "full"
    assert lumos.get(relay.try_put.remote(sink, "x", True, 0.2), timeout=20) == "full"
    source.put(7)
    assert lumos.get(relay.try_get.remote(source, True, None), timeout=20) == "7"


def test_object_refs_stay_refs(cluster: lumos.LumosContext) -> None:
    q = Queue()
    stored = lumos.put({"payload": 42})
    computed = square.remote(7)  # a task's result, maybe not computed yet
    q.put(stored)
    q.put_nowait(computed)
    q.put_nowait_batch([stored])
    asyncio.run(q.put_async(stored))

    first = q.get(timeout=10)
    assert isinstance(first, lumos.ObjectRef) and first == stored
    assert lumos.get(first, timeout=10) == {"payload": 42}
    second = q.get_nowait()
    assert isinstance(second, lumos.ObjectRef) and second == computed
    assert lumos.get(second, timeout=20) == 49
    assert q.get_nowait_batch(1) == [stored]
    assert asyncio.run(q.get_async(timeout=10)) == stored

    q.put(stored)
    assert lumos.get(get_and_resolve.remote(q), timeout=30) == ("ObjectRef", {"payload": 42})


def test_named_queue_actor_takes_actor_options(cluster: lumos.LumosContext) -> None:
    q = Queue(actor_options={"name": "util-queue-test", "max_concurrency": 50})
    try:
        assert lumos.get_actor("util-queue-test") == q.actor
        q.put("x")
        assert q.get(timeout=10) == "x"
    finally:
        q.shutdown()


# --------------------------------------------------------------------------- shutdown


def test_shutdown_then_use_raises(cluster: lumos.LumosContext) -> None:
    q = Queue()
    q.put(1)
    q.shutdown()
    for use in (q.size, q.empty, q.get_nowait, lambda: q.put(2), lambda: q.get(timeout=1),
                lambda: q.put_nowait_batch([1]), lambda: asyncio.run(q.get_async())):
        with pytest.raises(RuntimeError, match="shut down"):
            use()
    q.shutdown()  # a second call does nothing
    assert "shut down" in repr(q)


def test_shutdown_fails_getters_blocked_in_other_processes(cluster: lumos.LumosContext) -> None:
    q, started = Queue(), Queue()
    waiter = get_or_report.remote(q, started)
    assert started.get(timeout=30) == "started"
    ready, _ = lumos.wait([waiter], timeout=0.5)
    assert not ready
    q.shutdown(grace_period_s=5)
    assert lumos.get(waiter, timeout=30) == "actor died"


def test_forced_shutdown_kills_the_actor(cluster: lumos.LumosContext) -> None:
    q = Queue()
    actor = q.actor
    assert actor is not None
    q.shutdown(force=True)
    with pytest.raises(ActorDiedError):
        lumos.get(actor.qsize.remote(), timeout=20)


# --------------------------------------------------------------------------- bad input


def test_bad_arguments_raise_clear_errors(cluster: lumos.LumosContext) -> None:
    with pytest.raises(TypeError, match="maxsize"):
        Queue(maxsize="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="maxsize"):
        Queue(maxsize=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="actor_options"):
        Queue(actor_options=[("num_cpus", 1)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no_such_option"):
        Queue(actor_options={"no_such_option": 1})

    q = Queue(maxsize=2)
    for call in (lambda: q.put(1, timeout=-1), lambda: q.get(timeout=-0.5),
                 lambda: q.get(timeout=float("nan")),
                 lambda: asyncio.run(q.put_async(1, timeout=-1)),
                 lambda: asyncio.run(q.get_async(timeout=-1))):
        with pytest.raises(ValueError, match="'timeout' must be a non-negative number"):
            call()
    with pytest.raises(TypeError, match="timeout"):
        q.get(timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_items"):
        q.get_nowait_batch(-1)
    for bad in ("2", 1.0, True):
        with pytest.raises(TypeError, match="int"):
            q.get_nowait_batch(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        q.put_nowait_batch(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grace_period_s"):
        q.shutdown(grace_period_s=-1)
    with pytest.raises(TypeError, match="pickle"):
        q.put(threading.Lock())
    assert q.empty()  # nothing half-done by the failed calls
    q.shutdown()
