"""Streaming generator tasks: refs to yielded values as they are made (ObjectRefGenerator)."""

from __future__ import annotations

import asyncio
import os
import pickle
import time
from typing import Any, Iterator

import numpy as np
import pytest

import lumos
from lumos._private import worker_context
from tests.conftest import wait_for


@lumos.remote
def count(n: int) -> Iterator[int]:
    for i in range(n):
        yield i


@lumos.remote
def big(n: int) -> Iterator[Any]:
    for i in range(n):
        yield np.full(500_000, i, dtype=np.float64)  # 4 MB: kept in the object store


def test_a_generator_task_yields_refs_in_order(cluster: Any) -> None:
    gen = count.remote(5)
    assert isinstance(gen, lumos.ObjectRefGenerator)
    refs = list(gen)
    assert all(isinstance(r, lumos.ObjectRef) for r in refs)
    assert lumos.get(refs, timeout=30) == [0, 1, 2, 3, 4]
    assert gen.is_finished()
    assert "finished" in gen._repr_html_() and "5 values arrived · 5 taken" in gen._repr_html_()
    assert "5/5 taken" in repr(gen)
    # The task graph and the state API see the values it made.
    row = wait_for(lambda: [r for r in lumos.state.list_tasks()
                            if r["task_id"] == refs[0].task_id().hex() and r["state"] == "FINISHED"], 10)
    assert row[0]["return_object_ids"] == [r.hex() for r in refs]
    assert list(count.remote(0)) == []


def test_values_arrive_while_the_task_still_runs(cluster: Any, tmp_path: Any) -> None:
    gate = tmp_path / "go"

    @lumos.remote
    def slow() -> Iterator[str]:
        yield "first"
        while not os.path.exists(gate):
            time.sleep(0.01)
        yield "second"

    gen = slow.remote()
    assert lumos.get(next(gen), timeout=30) == "first"  # the task is still waiting for the gate
    assert not gen.next_ready()
    gate.write_text("go")
    assert lumos.get(next(gen), timeout=30) == "second"
    wait_for(gen.is_finished, 30)
    assert lumos.wait([gen], timeout=0)[0] == [gen]
    # At the end: next_ready() is False (as in Ray), is_finished() True, and wait() finds it ready.
    assert not gen.next_ready() and gen.is_finished()
    with pytest.raises(StopIteration):
        next(gen)


def test_stored_values_stream_too(cluster: Any) -> None:
    for i, ref in enumerate(big.remote(3)):
        value = lumos.get(ref, timeout=30)
        assert value.shape == (500_000,) and value[0] == i


def test_an_error_ends_the_stream_after_the_values_before_it(cluster: Any) -> None:
    @lumos.remote
    def fails_at(k: int) -> Iterator[int]:
        for i in range(10):
            if i == k:
                raise ValueError(f"bad item {i}")
            yield i

    refs = list(fails_at.remote(2))
    assert len(refs) == 3
    assert lumos.get(refs[:2], timeout=30) == [0, 1]
    with pytest.raises(ValueError, match="bad item 2"):
        lumos.get(refs[2], timeout=30)


def test_async_iteration(cluster: Any) -> None:
    async def main() -> list[int]:
        return [await ref async for ref in count.remote(4)]

    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_actor_generator_methods_stream(cluster: Any) -> None:
    @lumos.remote
    class Env:
        def __init__(self) -> None:
            self.steps = 0

        def rollout(self, n: int) -> Iterator[int]:
            for _ in range(n):
                self.steps += 1
                yield self.steps

        def total(self) -> int:
            return self.steps

    env = Env.remote()
    assert lumos.get(list(env.rollout.remote(3)), timeout=30) == [1, 2, 3]
    assert lumos.get(list(env.rollout.remote(2)), timeout=30) == [4, 5]
    assert lumos.get(env.total.remote(), timeout=30) == 5


def test_async_and_threaded_actors_stream_too(cluster: Any) -> None:
    @lumos.remote
    class Feed:
        async def ticks(self, n: int) -> Any:
            for i in range(n):
                await asyncio.sleep(0.01)
                yield i

        async def broken(self) -> Any:
            yield "ok"
            raise KeyError("gone")

        def plain(self, n: int) -> Iterator[int]:  # a sync generator in an async actor
            yield from range(n)

    feed = Feed.remote()
    a, b = feed.ticks.remote(3), feed.ticks.remote(2)  # two streams at once on one loop
    assert lumos.get(list(a), timeout=30) == [0, 1, 2]
    assert lumos.get(list(b), timeout=30) == [0, 1]
    refs = list(feed.broken.remote())
    assert lumos.get(refs[0], timeout=30) == "ok"
    with pytest.raises(KeyError, match="gone"):
        lumos.get(refs[1], timeout=30)
    assert lumos.get(list(feed.plain.remote(2)), timeout=30) == [0, 1]

    @lumos.remote(max_concurrency=2)
    class Pool:
        def squares(self, n: int) -> Iterator[int]:
            for i in range(n):
                yield i * i

    assert lumos.get(list(Pool.remote().squares.remote(4)), timeout=30) == [0, 1, 4, 9]


def test_streaming_option_and_refusals(cluster: Any) -> None:
    @lumos.remote(num_returns="streaming")
    def listed() -> list[str]:
        return ["a", "b"]

    with pytest.raises(ValueError, match="needs a generator function"):  # as in Ray
        listed.remote()
    # num_returns given explicitly: no stream, a plain ref.
    assert isinstance(count.options(num_returns=1).remote(0), lumos.ObjectRef)

    @lumos.remote
    async def agen() -> Any:
        yield 1

    with pytest.raises(TypeError, match="async generator"):
        agen.remote()
    with pytest.raises(TypeError, match="cannot be passed"):
        pickle.dumps(count.remote(1))
    gen = count.remote(2)
    assert lumos.get(gen) is gen  # (as in Ray: `for ref in ray.get(actor.stream.remote())` works)
    assert lumos.get(list(gen), timeout=30) == [0, 1]
    with pytest.raises(TypeError, match="iterate it"):
        lumos.get([count.remote(1)])


def test_a_dropped_generator_releases_its_values(cluster: Any) -> None:
    cw = worker_context.core_worker
    assert cw is not None
    gen = big.remote(4)
    first = next(gen)
    task_id = first.binary()[:16]
    wait_for(lambda: gen.is_finished() or gen._stream.count == 4, 30)
    del gen
    cw.drain_refs()
    mine = lambda: [oid for oid in list(cw.objects.entries) if oid[:16] == task_id]  # noqa: E731
    wait_for(lambda: len(mine()) == 1, 10)  # only the ref still held
    del first
    wait_for(lambda: not (cw.drain_refs() or mine()), 10)


@pytest.mark.timeout(90)
def test_a_worker_dying_mid_stream_is_retried_without_repeats(cluster: Any, tmp_path: Any) -> None:
    marker = tmp_path / "died-once"

    @lumos.remote(max_retries=2)
    def flaky() -> Iterator[int]:
        for i in range(5):
            if i == 3 and not marker.exists():
                marker.write_text("x")
                os._exit(1)
            yield i

    assert lumos.get(list(flaky.remote()), timeout=60) == [0, 1, 2, 3, 4]


def test_cancel_a_streaming_task(cluster: Any) -> None:
    @lumos.remote
    def endless() -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1
            time.sleep(0.01)

    gen = endless.remote()
    assert lumos.get(next(gen), timeout=30) == 0
    lumos.cancel(gen)
    with pytest.raises(lumos.exceptions.TaskCancelledError):
        for ref in gen:
            lumos.get(ref, timeout=30)


def test_malformed_generator_items_are_refused(cluster: Any) -> None:
    from lumos._private.ids import new_task_id, return_object_id
    from lumos._private.protocol import messages as m
    cw = worker_context.core_worker
    assert cw is not None
    tid = new_task_id()
    good = m.ReturnObject(return_object_id(tid, 1), b"x", 1, None, [])
    bad_items = [
        m.GeneratorItem(tid, 5, good),                                        # index and id disagree
        m.GeneratorItem(tid, -1, good),
        m.GeneratorItem(tid[:3], 0, good),
        m.GeneratorItem(tid, 0, m.ReturnObject(good.object_id, None, 1, None, [])),  # no value, no node
        m.GeneratorItem(tid, 0, m.ReturnObject(good.object_id, 7, 1, None, [])),     # type: ignore[arg-type]
        m.GeneratorItem(tid, 0, m.ReturnObject(good.object_id, b"x", 1, None, [["id", 3]])),
        m.GeneratorItem(tid, 0, "not an item"),                               # type: ignore[arg-type]
    ]

    async def feed(msg: Any) -> str:
        try:
            cw._handle_generator_item(None, msg)  # type: ignore[arg-type]
        except ValueError as e:
            return str(e)
        return "accepted"

    for msg in bad_items:
        assert cw.run_sync(feed(msg), 10) == "malformed GeneratorItem", msg
    # A well-formed item for a task this process does not run is dropped quietly.
    assert cw.run_sync(feed(m.GeneratorItem(tid, 0, good)), 10) == "accepted"
    assert lumos.get(list(count.remote(2)), timeout=30) == [0, 1]



@pytest.mark.timeout(90)
def test_an_actor_stream_stops_when_its_caller_dies(cluster: Any, tmp_path: Any) -> None:
    progress = tmp_path / "progress"

    @lumos.remote(num_cpus=0)
    class Feeder:
        def ticks(self, path: str) -> Iterator[int]:
            i = 0
            while True:
                with open(path, "a") as f:
                    f.write(".")
                yield i
                i += 1
                time.sleep(0.01)

        def alive(self) -> bool:
            return True

    @lumos.remote(num_cpus=0)
    class Consumer:
        def start(self, feeder: Any, path: str) -> int:
            self.gen = feeder.ticks.remote(path)  # this actor owns the stream
            return lumos.get(next(self.gen))

    feeder, consumer = Feeder.remote(), Consumer.remote()
    assert lumos.get(consumer.start.remote(feeder, str(progress)), timeout=30) == 0
    lumos.kill(consumer)
    size = lambda: progress.stat().st_size  # noqa: E731

    def settled() -> bool:
        before = size()
        time.sleep(0.5)
        return size() == before

    wait_for(settled, 30)  # the feeder noticed its caller is gone and stopped the stream
    assert settled()
    assert lumos.get(feeder.alive.remote(), timeout=30)  # and serves other calls again


@pytest.mark.timeout(90)
def test_a_retried_stream_that_fails_earlier_still_reports_its_error(cluster: Any, tmp_path: Any) -> None:
    marker = tmp_path / "died-once"

    @lumos.remote(max_retries=1)
    def unsteady() -> Iterator[int]:
        if marker.exists():
            yield 0
            raise RuntimeError("second run failed early")
        for i in range(3):
            yield i
        marker.write_text("x")
        time.sleep(0.5)  # the three values leave the worker
        os._exit(1)  # then it dies: the task runs again

    refs = list(unsteady.remote())
    assert lumos.get(refs[:3], timeout=60) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="failed early"):
        lumos.get(refs[3], timeout=60)
    assert len(refs) == 4


def test_wait_takes_generators_beside_refs(cluster: Any) -> None:
    """As in Ray: a streaming generator in wait()'s list is ready when its next value (or
    its end) is; refs and generators mix, and both lists keep the order given (lumos
    raised TypeError)."""
    @lumos.remote
    def slow_stream(delay: float) -> Any:
        time.sleep(delay)
        yield 1

    late = slow_stream.remote(20.0)
    soon = slow_stream.remote(0.0)
    ref = lumos.put(5)
    ready, rest = lumos.wait([late, soon, ref], num_returns=2, timeout=30)
    assert ready == [soon, ref] and rest == [late]
    assert lumos.get(next(soon), timeout=30) == 1
    ready, rest = lumos.wait([late], timeout=0.2)
    assert ready == [] and rest == [late]
    ready, _ = lumos.wait([soon], timeout=30)  # its end is ready too
    assert ready == [soon] and list(soon) == []
    with pytest.raises(ValueError, match="unique"):
        lumos.wait([soon, soon])
    lumos.cancel(late)
