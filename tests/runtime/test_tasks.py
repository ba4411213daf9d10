"""Tasks on a real local cluster: submission, arguments, returns, nesting, wait."""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest

import lumos
from lumos.exceptions import GetTimeoutError, TaskError


@lumos.remote
def add(x, y=0):
    return x + y


@lumos.remote
def sleep_then(t, value=None):
    time.sleep(t)
    return t if value is None else value


def test_remote_function_returns_value(cluster):
    assert lumos.get(add.remote(1, 2), timeout=30) == 3


def test_kwargs_and_options(cluster):
    assert lumos.get(add.remote(1, y=5), timeout=30) == 6
    assert lumos.get(add.options(num_cpus=0.5, name="half").remote(2, 3), timeout=30) == 5


def test_get_list_keeps_order(cluster):
    refs = [add.remote(i, i) for i in range(50)]
    assert lumos.get(refs, timeout=30) == [2 * i for i in range(50)]


def test_top_level_ref_args_are_resolved(cluster):
    ref = lumos.put(40)
    assert lumos.get(add.remote(ref, 2), timeout=30) == 42
    chained = add.remote(add.remote(1, 1), y=add.remote(2, 2))
    assert lumos.get(chained, timeout=30) == 6


def test_refs_nested_in_containers_arrive_as_refs(cluster):
    @lumos.remote
    def inspect(items):
        return [type(x).__name__ for x in items], lumos.get(items[0]) + lumos.get(items[1]["k"])

    names, total = lumos.get(inspect.remote([lumos.put(1), {"k": lumos.put(2)}]), timeout=30)
    assert names == ["ObjectRef", "dict"]
    assert total == 3


def test_num_returns(cluster):
    @lumos.remote(num_returns=3)
    def three():
        return 1, "two", [3]

    a, b, c = three.remote()
    assert lumos.get([a, b, c], timeout=30) == [1, "two", [3]]

    @lumos.remote(num_returns=0)
    def nothing():
        return None

    assert nothing.remote() is None


def test_num_returns_mismatch_is_a_task_error(cluster):
    @lumos.remote(num_returns=2)
    def one():
        return 1, 2, 3

    a, _ = one.remote()
    with pytest.raises(TaskError, match="num_returns=2"):
        lumos.get(a, timeout=30)


def test_nested_tasks(cluster):
    @lumos.remote
    def fan_out(n):
        return sum(lumos.get([add.remote(i, 1) for i in range(n)], timeout=30))

    assert lumos.get(fan_out.remote(20), timeout=60) == sum(range(1, 21))


def test_deeply_nested_tasks_do_not_deadlock_on_two_cpus(cluster):
    @lumos.remote
    def depth(n):
        if n == 0:
            return 0
        return 1 + lumos.get(depth.remote(n - 1), timeout=60)

    assert lumos.get(depth.remote(6), timeout=90) == 6


def test_get_timeout_raises_get_timeout_error(cluster):
    ref = sleep_then.remote(5)
    t0 = time.monotonic()
    with pytest.raises(GetTimeoutError) as info:
        lumos.get(ref, timeout=0.2)
    assert isinstance(info.value, TimeoutError)
    assert time.monotonic() - t0 < 3
    lumos.cancel(ref, force=True)


def test_get_reads_rays_minus_one_as_no_timeout(cluster):
    # Ray's get() passes timeout=-1 on as "wait as long as it takes"; Ray code uses it.
    assert lumos.get(sleep_then.remote(0.2, "done"), timeout=-1) == "done"
    assert lumos.get([lumos.put(1)], timeout=-1) == [1]
    with pytest.raises(ValueError, match=">= 0"):
        lumos.get(lumos.put(1), timeout=-2)
    with pytest.raises(ValueError, match=">= 0"):
        lumos.wait([lumos.put(1)], timeout=-1)  # (Ray's wait refuses it too)


def test_wait_ready_keeps_the_input_order(cluster):
    """As Ray documents: ready lists the refs in the order given, not as they finished."""
    refs = [sleep_then.remote(0.9, "slow"), sleep_then.remote(0.05, "fast")]
    ready, not_ready = lumos.wait(refs, num_returns=2, timeout=30)
    assert lumos.get(ready, timeout=30) == ["slow", "fast"]
    assert not_ready == []


def test_wait_num_returns_and_timeout(cluster):
    refs = [sleep_then.remote(0.05, 1), sleep_then.remote(10, 2)]
    ready, not_ready = lumos.wait(refs, num_returns=1, timeout=5)
    assert ready == [refs[0]] and not_ready == [refs[1]]
    ready, not_ready = lumos.wait(refs, num_returns=2, timeout=0.1)
    assert ready == [refs[0]] and not_ready == [refs[1]]
    lumos.cancel(refs[1], force=True)


def test_wait_validates_arguments(cluster):
    ref = lumos.put(1)
    with pytest.raises(TypeError):
        lumos.wait(ref)
    with pytest.raises(ValueError, match="exceed"):
        lumos.wait([ref], num_returns=2)
    with pytest.raises(ValueError, match="unique"):
        lumos.wait([ref, ref])
    assert lumos.wait([]) == ([], [])  # as in Ray


def test_calling_remote_function_directly_is_a_clear_error(cluster):
    with pytest.raises(TypeError, match=r"add\.remote"):
        add(1, 2)


def test_unpicklable_argument_fails_at_call_site(cluster):
    import threading
    with pytest.raises(TypeError, match="could not serialize"):
        add.remote(threading.Lock())
    assert lumos.get(add.remote(1, 1), timeout=30) == 2


def test_bad_options_are_rejected_with_choices(cluster):
    with pytest.raises(ValueError, match="valid options"):
        add.options(num_cpu=1)
    with pytest.raises(ValueError, match=">= 0"):
        add.options(num_cpus=-1)
    with pytest.raises(ValueError, match="fractions"):
        add.options(num_gpus=1.5)
    with pytest.raises(TypeError):
        lumos.get("not a ref")


def test_large_arguments_by_value_go_through_the_store(cluster):
    import numpy as np

    @lumos.remote
    def total(a):
        return float(a.sum())

    arr = np.ones(1_000_000)
    assert lumos.get(total.remote(arr), timeout=30) == 1_000_000.0


def test_many_tasks(cluster):
    refs = [add.remote(i) for i in range(3000)]
    assert sum(lumos.get(refs, timeout=60)) == sum(range(3000))


def test_runtime_context_in_task(cluster):
    @lumos.remote
    def ctx():
        c = lumos.get_runtime_context()
        return c.get_job_id(), c.get_node_id(), c.get_task_id(), c.get_worker_id()

    job, node, task, worker = lumos.get(ctx.remote(), timeout=30)
    driver = lumos.get_runtime_context()
    assert job == driver.get_job_id()
    assert node == driver.get_node_id()
    assert task and worker and worker != driver.get_worker_id()
    assert driver.get_task_id() is None


def test_task_queued_behind_a_blocked_task_runs_elsewhere(cluster: lumos.LumosContext) -> None:
    """A task that waits in get() must not hold back, on its worker, the task it waits for."""

    @lumos.remote
    def slow_input() -> int:
        time.sleep(0.5)
        return 1

    @lumos.remote
    def step(kind: str, box: Any) -> int:
        if kind == "wait":
            return lumos.get(box[0], timeout=30) + 1
        return box + 1

    lumos.get([step.remote("make", 0) for _ in range(50)])  # short tasks: pipelined deeply
    producer = step.remote("make", slow_input.remote())  # ready only after slow_input
    consumer = step.remote("wait", [producer])  # pushed first, waits for producer
    assert lumos.get(consumer, timeout=30) == 3


def test_util_node_ip_and_state_alias(cluster: lumos.LumosContext) -> None:
    @lumos.remote
    def ip() -> str:
        return lumos.util.get_node_ip_address()

    assert lumos.util.get_node_ip_address() == "127.0.0.1"
    assert lumos.get(ip.remote(), timeout=30) == "127.0.0.1"
    assert lumos.util.state.list_tasks.__module__ == "lumos.util.state"  # Ray's signature over lumos.state


def test_a_queued_call_without_arguments_holds_no_list_of_ids(cluster):
    """A burst of calls without arguments keeps thousands of PendingTasks: their id fields
    are tuples (``()`` when empty), not lists the garbage collector walks at every pass."""
    import gc

    from lumos._private import worker_context
    from tests.conftest import wait_for

    cw = worker_context.require()
    busy = [sleep_then.remote(1.0) for _ in range(int(lumos.cluster_resources()["CPU"]))]
    refs = [add.remote(1) for _ in range(20)] + [sleep_then.remote(0, busy[0])]
    ids = {r._id[:16] for r in refs}
    wait_for(lambda: ids <= set(cw.tasks), timeout_s=30)
    for tid in ids:
        task = cw.tasks.get(tid)
        if task is None:
            continue  # finished meanwhile
        assert type(task.return_ids) is tuple and type(task.dep_ids) is tuple and type(task.nested_ids) is tuple
        if not task.spec.deps:
            assert task.dep_ids == () and not gc.is_tracked(task.dep_ids)
    assert lumos.get(refs[:20], timeout=60) == [1] * 20
    lumos.get(refs[-1], timeout=60)
    lumos.get(busy, timeout=60)


@lumos.remote
def _pair():
    return 1, 2


def test_a_function_and_its_options_alternate_each_with_its_own_template(cluster):
    """A call reuses the template of the previous call made with the same options dict
    (no cache key built per call); alternating with ``.options()`` switches correctly."""
    two = _pair.options(num_returns=2)
    for _ in range(3):
        assert lumos.get(_pair.remote(), timeout=60) == (1, 2)
        assert _pair._last_template[0] is _pair._options
        assert lumos.get(two.remote(), timeout=60) == [1, 2]
        assert _pair._last_template[0] is two._options and _pair._last_template[1].num_returns == 2


def test_short_tasks_pipelined_behind_a_long_one_run_elsewhere(cluster):
    """A function whose calls are short is pipelined several deep per worker; the calls
    queued behind one that runs long go back to the owner, which runs them on the other
    workers, instead of waiting for it (they all waited the long call's whole run)."""

    @lumos.remote
    def mostly_short(i: int) -> int:
        if i == 5:
            time.sleep(60)
        return i

    lumos.get([mostly_short.remote(-1) for _ in range(100)], timeout=60)  # known short: pipelined
    refs = [mostly_short.remote(i) for i in range(200)]
    try:
        assert lumos.get(refs[:5] + refs[6:], timeout=20) == list(range(5)) + list(range(6, 200))
    finally:
        lumos.cancel(refs[5], force=True)


def test_calls_with_wrong_arguments_raise_at_the_call(cluster):
    """As in Ray: a call is checked against the function's signature when it is made (it
    was sent, failed on a worker, and raised from get())."""

    @lumos.remote
    def f(a, b=2, *, c=3):
        return a + b + c

    @lumos.remote
    def g(*args, **kwargs):
        return len(args) + len(kwargs)

    @lumos.remote
    def h(a, *, must):
        return a + must

    with pytest.raises(TypeError, match=r"^f\(\) missing a required argument: 'a'$"):
        f.remote()
    with pytest.raises(TypeError, match=r"f\(\) too many positional arguments"):
        f.remote(1, 2, 3)
    with pytest.raises(TypeError, match="unexpected keyword argument 'd'"):
        f.options(num_cpus=0).remote(1, d=4)
    with pytest.raises(TypeError, match="missing a required argument: 'must'"):
        h.remote(1)
    ref = lumos.put(10)
    assert lumos.get([f.remote(1), f.remote(1, 1, c=1), f.remote(a=ref), g.remote(1, 2, x=3), g.remote(),
                      h.remote(1, must=2)], timeout=60) == [6, 3, 15, 3, 0, 3]


def _thread_names() -> list[str]:
    import os
    names = []
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass  # a thread that ended meanwhile
    return names


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kernel thread names are Linux's")
def test_the_io_thread_is_named_lumos_io_in_the_kernel_in_drivers_and_workers(cluster):
    """``top -H``, ``ps -L`` and profilers see lumos's io thread by name, in the user's
    process and in a worker (beside numpy's threads, all called like the process)."""

    @lumos.remote
    def names() -> list[str]:
        import numpy  # noqa: F401  (its threads take the process's name)
        return _thread_names()

    assert "lumos-io" in _thread_names()
    assert "lumos-io" in lumos.get(names.remote(), timeout=30)
