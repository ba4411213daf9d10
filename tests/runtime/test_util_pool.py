"""``lumos.util.multiprocessing.Pool``: the stdlib Pool API on actors, on a real cluster."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import threading
import time
from typing import Any, Iterator

import pytest

import lumos
from lumos.exceptions import ActorDiedError, TaskError
from lumos.util.multiprocessing import AsyncResult, Pool

from tests.conftest import process_gone, wait_for

#: Set in each pool actor by ``init_worker``.
_greeting: str | None = None
_init_calls = 0


class PoolFuncError(Exception):
    pass


def square(x: int) -> int:
    return x * x


def slow_square(x: int) -> int:
    time.sleep(0.3 if x == 0 else 0.0)
    return x * x


def fail_on(x: int) -> int:
    if x == 3:
        raise PoolFuncError(f"bad item {x}")
    return x


def sleep_for(t: float) -> float:
    time.sleep(t)
    return t


def pid_of(_: Any = None) -> int:
    return os.getpid()


def init_worker(greeting: str) -> None:
    global _greeting, _init_calls
    _greeting = greeting
    _init_calls += 1


def greet(name: str) -> tuple[str, int, int]:
    return f"{_greeting}, {name}", _init_calls, os.getpid()


def failing_init() -> None:
    raise PoolFuncError("initializer failed")


def pool_threads(prefix: str = "lumos-pool") -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix)]


@pytest.fixture(scope="module")
def pool(cluster: lumos.LumosContext) -> Iterator[Pool]:
    """A pool shared by the tests that leave it running. Its actors hold no CPUs, so tests
    that make their own pools still have the cluster's two."""
    shared = Pool(processes=2)
    try:
        yield shared
    finally:
        shared.terminate()
    wait_for(lambda: not pool_threads(), 10)


@pytest.fixture(autouse=True)
def no_pool_threads_left() -> Iterator[None]:
    """Each test's imap feeders are done, and the pools it made have stopped their threads."""
    before = set(pool_threads())
    yield
    wait_for(lambda: not set(pool_threads()) - before, 10)
    wait_for(lambda: not pool_threads("lumos-pool-feeder"), 10)


# --------------------------------------------------------------------------- map family


def test_map_returns_results_in_input_order(pool: Pool) -> None:
    assert pool.map(square, range(20)) == [x * x for x in range(20)]
    for chunksize in (1, 3, 100):
        assert pool.map(square, range(10), chunksize=chunksize) == [x * x for x in range(10)]
    # The first item is the slowest; its result still comes first.
    assert pool.map(slow_square, range(6), chunksize=1) == [x * x for x in range(6)]
    assert pool.map(square, iter([4, 5])) == [16, 25]
    assert pool.map(square, []) == []


def test_map_spreads_work_over_every_actor(cluster: lumos.LumosContext) -> None:
    with Pool(processes=4) as pool:  # more actors than CPUs: they hold none
        pids = set(pool.map(pid_of, range(16), chunksize=1))
        assert len(pids) == 4
        assert os.getpid() not in pids


def test_starmap_unpacks_argument_tuples(pool: Pool) -> None:
    assert pool.starmap(pow, [(2, 3), (3, 2), (10, 0)]) == [8, 9, 1]
    assert pool.starmap(divmod, [(7, 2)] * 5, chunksize=2) == [(3, 1)] * 5
    got: list[Any] = []
    result = pool.starmap_async(pow, [(2, 2), (2, 4)], callback=got.append)
    assert result.get(timeout=10) == [4, 16]
    assert got == [[4, 16]]


def test_apply_and_apply_async_with_callback(pool: Pool) -> None:
    assert pool.apply(divmod, (7, 2)) == (3, 1)
    assert pool.apply(sorted, ([3, 1, 2],), {"reverse": True}) == [3, 2, 1]
    seen: list[tuple[Any, str, int]] = []
    result = pool.apply_async(square, (9,), callback=lambda v: seen.append(
        (v, threading.current_thread().name, os.getpid())))
    assert isinstance(result, AsyncResult)
    assert result.get(timeout=10) == 81
    # The callback ran in this process, on the pool's results thread, before get() returned.
    assert seen == [(81, "lumos-pool-results", os.getpid())]


def test_map_async_error_callback_gets_the_users_exception(pool: Pool) -> None:
    errors: list[BaseException] = []
    results: list[Any] = []
    result = pool.map_async(fail_on, range(6), chunksize=1, callback=results.append,
                            error_callback=errors.append)
    with pytest.raises(PoolFuncError, match="bad item 3"):
        result.get(timeout=10)
    assert results == []
    assert len(errors) == 1
    assert isinstance(errors[0], PoolFuncError) and isinstance(errors[0], TaskError)
    assert "fail_on" in str(errors[0])  # the remote traceback comes along

    ok: list[Any] = []
    assert pool.map_async(square, range(3), callback=ok.append).get(timeout=10) == [0, 1, 4]
    assert ok == [[0, 1, 4]]


def test_exceptions_reach_the_caller_as_the_users_type(pool: Pool) -> None:
    with pytest.raises(PoolFuncError, match="bad item 3"):
        pool.map(fail_on, range(5))
    with pytest.raises(PoolFuncError):
        pool.apply(fail_on, (3,))
    with pytest.raises(ZeroDivisionError):
        pool.starmap(divmod, [(1, 0)])
    # imap raises at the failing item and can go on after it.
    it = pool.imap(fail_on, range(5))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(PoolFuncError):
        next(it)
    assert list(it) == [4]
    # The pool still works after its function raised.
    assert pool.map(square, [2]) == [4]


def test_a_raising_callback_does_not_break_the_pool(pool: Pool) -> None:
    def bad_callback(_: Any) -> None:
        raise RuntimeError("callback bug")

    result = pool.apply_async(square, (3,), callback=bad_callback)
    assert result.get(timeout=10) == 9
    assert pool.apply_async(square, (4,)).get(timeout=10) == 16


# --------------------------------------------------------------------------- imap


def test_imap_yields_results_in_input_order(pool: Pool) -> None:
    assert list(pool.imap(slow_square, range(8))) == [x * x for x in range(8)]
    assert list(pool.imap(square, range(10), chunksize=3)) == [x * x for x in range(10)]
    assert list(pool.imap(square, (x for x in range(5)))) == [0, 1, 4, 9, 16]
    assert list(pool.imap(square, [])) == []


def test_imap_unordered_returns_every_result_as_it_finishes(pool: Pool) -> None:
    assert sorted(pool.imap_unordered(square, range(12), chunksize=2)) == sorted(x * x for x in range(12))
    it = pool.imap_unordered(sleep_for, [1.0, 0.0, 0.0])
    assert it.next(timeout=10) == 0.0  # a fast item, not the slow one submitted first
    assert sorted(it) == [0.0, 1.0]


def test_imap_raises_what_the_iterable_raised_after_the_items_before_it(pool: Pool) -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise PoolFuncError("iterable broke")

    it = pool.imap(square, items())
    assert [next(it), next(it)] == [1, 4]
    with pytest.raises(PoolFuncError, match="iterable broke"):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


# --------------------------------------------------------------------------- initializer


def test_initializer_runs_once_in_each_actor(cluster: lumos.LumosContext) -> None:
    with Pool(processes=3, initializer=init_worker, initargs=("hello",),
              ) as pool:
        out = pool.map(greet, ["a", "b", "c", "d", "e", "f"], chunksize=1)
        assert [text for text, _, _ in out] == [f"hello, {n}" for n in "abcdef"]
        assert {calls for _, calls, _ in out} == {1}
        assert len({pid for _, _, pid in out}) == 3


def test_initializer_error_fails_the_pool_and_leaves_no_actors(cluster: lumos.LumosContext) -> None:
    with pytest.raises(PoolFuncError, match="initializer failed"):
        Pool(processes=2, initializer=failing_init)
    # Its CPUs came back: a full-size pool starts.
    with Pool(processes=2) as pool:
        assert pool.map(square, [3]) == [9]


# --------------------------------------------------------------------------- AsyncResult


def test_async_result_get_times_out_with_multiprocessing_timeout_error(pool: Pool) -> None:
    result = pool.apply_async(sleep_for, (0.5,))
    start = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError):
        result.get(timeout=0.05)
    assert time.monotonic() - start < 0.4
    assert result.get(timeout=10) == 0.5
    it = pool.imap(sleep_for, [0.5])
    with pytest.raises(multiprocessing.TimeoutError):
        it.next(timeout=0.05)
    assert it.next(timeout=10) == 0.5


def test_ready_and_successful_follow_the_result(pool: Pool) -> None:
    pending = pool.apply_async(sleep_for, (0.3,))
    assert not pending.ready()
    with pytest.raises(ValueError, match="not ready"):
        pending.successful()
    pending.wait(timeout=10)
    assert pending.ready() and pending.successful()

    failed = pool.apply_async(fail_on, (3,))
    failed.wait(timeout=10)
    assert failed.ready() and not failed.successful()

    waited = pool.apply_async(sleep_for, (0.3,))
    waited.wait(timeout=0.01)  # a timeout in wait() does not raise
    assert not waited.ready()
    waited.wait(timeout=10)


# --------------------------------------------------------------------------- lifecycle


def test_close_then_join_finishes_outstanding_work_and_stops_the_actors(cluster: lumos.LumosContext) -> None:
    pool = Pool(processes=2)
    try:
        actors = list(pool._actors)
        done: list[Any] = []
        result = pool.apply_async(sleep_for, (0.3,), callback=done.append)
        it = pool.imap(square, range(4))
        pool.close()
        pool.join()
        assert result.ready() and result.get(timeout=0) == 0.3
        assert done == [0.3]
        assert list(it) == [0, 1, 4, 9]  # accepted before close(), so it ran
        for actor in actors:
            with pytest.raises(ActorDiedError):
                lumos.get(actor.ready.remote(), timeout=10)
    finally:
        pool.terminate()


def test_use_after_close_or_terminate_raises(cluster: lumos.LumosContext) -> None:
    pool = Pool(processes=1)
    pool.close()
    calls = [lambda: pool.map(square, [1]), lambda: pool.map_async(square, [1]),
             lambda: pool.starmap(pow, [(1, 1)]), lambda: pool.starmap_async(pow, [(1, 1)]),
             lambda: pool.apply(square, (1,)), lambda: pool.apply_async(square, (1,)),
             lambda: pool.imap(square, [1]), lambda: pool.imap_unordered(square, [1]),
             lambda: pool.__enter__()]
    for call in calls:
        with pytest.raises(ValueError, match="Pool not running"):
            call()
    pool.join()
    pool.terminate()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(square, [1])


def test_context_manager_terminates_the_actors(cluster: lumos.LumosContext) -> None:
    errors: list[BaseException] = []
    with Pool() as pool:  # as many actors as the cluster has CPUs
        assert "pool_size=2" in repr(pool)
        actors = list(pool._actors)
        pids = set(pool.map(pid_of, range(8), chunksize=1))
        assert len(pids) == 2
        pending = pool.apply_async(sleep_for, (30,), error_callback=errors.append)
    # Killed mid-call: the pending result fails at once, and its error callback has run.
    with pytest.raises(ActorDiedError):
        pending.get(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], ActorDiedError)
    for actor in actors:
        with pytest.raises(ActorDiedError):
            lumos.get(actor.ready.remote(), timeout=10)
    for pid in pids:
        wait_for(lambda: process_gone(pid), 10)
    assert "TERMINATE" in repr(pool)


def test_a_dropped_pool_stops_its_thread_and_actors(cluster: lumos.LumosContext) -> None:
    pool = Pool(processes=1)
    actor, thread = pool._actors[0], pool._handler.thread
    assert pool.map(square, [3]) == [9]
    del pool
    gc.collect()
    wait_for(lambda: not thread.is_alive(), 10)  # it kills the actor, then exits
    with pytest.raises(ActorDiedError):
        lumos.get(actor.ready.remote(), timeout=10)


# --------------------------------------------------------------------------- bad input


def test_bad_arguments_raise_at_the_call(cluster: lumos.LumosContext) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Pool(processes=0)
    with pytest.raises(ValueError, match="at least 1"):
        Pool(processes=-2)
    with pytest.raises(TypeError, match="processes"):
        Pool(processes="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="initializer"):
        Pool(processes=1, initializer=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ray_remote_args"):
        Pool(processes=1, ray_remote_args=[("num_cpus", 0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="maxtasksperchild"):
        Pool(processes=1, maxtasksperchild=0)

    with Pool(processes=1, maxtasksperchild=5, context=object()) as pool:  # accepted, ignored
        for call in (lambda: pool.map(5, [1]), lambda: pool.apply(None), lambda: pool.imap("f", [1]),
                     lambda: pool.starmap_async(3, [(1,)]), lambda: pool.apply_async(square, (1,), callback=1)):
            with pytest.raises(TypeError, match="callable"):
                call()
        with pytest.raises(ValueError, match="chunksize"):
            pool.map(square, [1], chunksize=0)
        with pytest.raises(ValueError, match="chunksize"):
            pool.imap(square, [1], chunksize=0)
        with pytest.raises(TypeError):
            pool.map(square, 5)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="still running"):
            pool.join()
        with pytest.raises(NotImplementedError, match="cannot be pickled"):
            pickle.dumps(pool)
        assert pool.map(square, [2]) == [4]  # none of the above broke it
