"""Ray programs run unchanged: behaviours a Ray user meets, checked against Ray's own.

Each test names the Ray behaviour it checks; the audit of the whole public surface is in
``test_ray_compat_audit.py``.
"""

from __future__ import annotations

import asyncio
import functools
import io
import os
import subprocess
import sys
import textwrap
from typing import Any, Iterator

import pytest

import lumos
from lumos.exceptions import ActorDiedError, RayActorError, TaskCancelledError, TaskError
from lumos.util.placement_group import get_current_placement_group, placement_group, remove_placement_group
from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tests.conftest import wait_for


# ----------------------------------------------------------------------------- runtime context


@lumos.remote
class Self:
    def me(self) -> Any:
        return lumos.get_runtime_context().current_actor

    def ping(self) -> str:
        return "pong"

    def function_name(self) -> str | None:
        return lumos.get_runtime_context().get_task_function_name()

    def ping_through_self(self) -> Any:
        # a call to itself through its own handle, from inside (Ray's current_actor idiom)
        return lumos.get_runtime_context().current_actor.ping.remote()

    def ids(self) -> dict[str, Any]:
        import warnings
        ctx = lumos.get_runtime_context()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = {"job": ctx.job_id.hex(), "node": ctx.node_id.hex(), "task": ctx.task_id.hex(),
                   "actor": ctx.actor_id.hex()}
        out["warned"] = sorted({w.category.__name__ for w in caught})
        out["new"] = {"job": ctx.get_job_id(), "node": ctx.get_node_id(), "task": ctx.get_task_id(),
                      "actor": ctx.get_actor_id()}
        return out


def test_current_actor_is_the_calling_actors_handle(cluster: lumos.LumosContext) -> None:
    a = Self.remote()
    me = lumos.get(a.me.remote(), timeout=30)
    assert isinstance(me, lumos.ActorHandle) and me == a
    assert lumos.get(me.ping.remote(), timeout=30) == "pong"
    assert lumos.get(lumos.get(a.ping_through_self.remote(), timeout=30), timeout=30) == "pong"


def test_an_actor_calls_function_name_is_module_class_method(cluster: lumos.LumosContext) -> None:
    # As in Ray (it was the method's bare name).
    assert lumos.get(Self.remote().function_name.remote(), timeout=30) == f"{__name__}.Self.function_name"


def test_current_actor_outside_an_actor_raises(cluster: lumos.LumosContext) -> None:
    with pytest.raises(RuntimeError, match="only available inside an actor"):
        lumos.get_runtime_context().current_actor


def test_deprecated_id_properties_warn_and_match_the_getters(cluster: lumos.LumosContext) -> None:
    out = lumos.get(Self.remote().ids.remote(), timeout=30)
    assert out["warned"] == ["DeprecationWarning"]
    assert {k: out[k] for k in ("job", "node", "task", "actor")} == out["new"]
    ctx = lumos.get_runtime_context()
    with pytest.warns(DeprecationWarning, match="get_job_id"):
        assert ctx.job_id.hex() == ctx.get_job_id()
    with pytest.warns(DeprecationWarning, match="get_node_id"):
        assert ctx.node_id.hex() == ctx.get_node_id()
    with pytest.warns(DeprecationWarning):
        assert ctx.task_id is None and ctx.actor_id is None  # the driver runs no task


# ----------------------------------------------------------------------------- remote() targets


class CallableThing:
    def __call__(self, x: int) -> int:
        return x


def plain(x: int) -> int:
    return x


@pytest.mark.parametrize("target", [CallableThing(), functools.partial(plain, 1), len, CallableThing().__call__],
                         ids=["instance", "partial", "builtin", "bound-method"])
def test_remote_on_a_callable_that_is_not_a_function_or_class_raises_type_error(target: Any) -> None:
    with pytest.raises(TypeError, match="function or a class"):
        lumos.remote(target)
    with pytest.raises(TypeError, match="function or a class"):
        lumos.remote(num_cpus=1)(target)


# ----------------------------------------------------------------------------- errors


class InitFailed(Exception):
    pass


@lumos.remote
class BrokenInit:
    def __init__(self) -> None:
        raise InitFailed("no config file")

    def f(self) -> int:
        return 1


def test_actor_whose_init_raised_raises_actor_died_error_on_every_call(cluster: lumos.LumosContext) -> None:
    b = BrokenInit.remote()
    for _ in range(2):
        with pytest.raises(RayActorError) as info:
            lumos.get(b.f.remote(), timeout=30)
        assert isinstance(info.value, ActorDiedError)
        assert "creation task" in str(info.value) and "InitFailed: no config file" in str(info.value)


class CodedError(Exception):
    """Cannot be rebuilt from its args: its __init__ takes two arguments, args holds one."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(f"code {code}: {text}")
        self.code = code


@lumos.remote(max_retries=0)
def raises_coded() -> None:
    raise CodedError(7, "disk quota exceeded")


def test_exception_that_cannot_be_rebuilt_keeps_its_message_and_traceback(cluster: lumos.LumosContext) -> None:
    with pytest.raises(TaskError) as info:
        lumos.get(raises_coded.remote(), timeout=30)
    text = str(info.value)
    assert "CodedError: code 7: disk quota exceeded" in text
    assert "raises_coded" in text and "Traceback" in text


# ----------------------------------------------------------------------------- options


def test_a_tasks_error_put_or_returned_raises_when_got_as_in_ray(cluster: lumos.LumosContext) -> None:
    """Ray stores a ``RayTaskError`` value as an error: ``get`` of it raises, whether it was
    put or returned by a task (a plain exception stays a value)."""
    @lumos.remote
    def boom() -> None:
        raise ValueError("boom")

    @lumos.remote
    def give_back(e: Any) -> Any:
        return e

    with pytest.raises(TaskError) as info:
        lumos.get(boom.remote(), timeout=30)
    err = info.value
    with pytest.raises(ValueError, match="boom"):
        lumos.get(lumos.put(err), timeout=30)
    with pytest.raises(ValueError, match="boom"):
        lumos.get(give_back.remote(err), timeout=30)
    plain = lumos.get(give_back.remote(KeyError("plain")), timeout=30)
    assert type(plain) is KeyError and plain.args == ("plain",)
    plain_put = lumos.get(lumos.put(KeyError("put")), timeout=30)
    assert type(plain_put) is KeyError


def test_enable_task_events_is_accepted_for_tasks_actors_and_methods(cluster: lumos.LumosContext) -> None:
    @lumos.remote(enable_task_events=False)
    def f() -> int:
        return 1

    @lumos.remote(enable_task_events=False)
    class A:
        @lumos.method(enable_task_events=False)
        def g(self) -> int:
            return 2

    a = A.remote()
    assert lumos.get([f.remote(), f.options(enable_task_events=True).remote(), a.g.remote(),
                      a.g.options(enable_task_events=False).remote()], timeout=30) == [1, 1, 2, 2]
    with pytest.raises(TypeError, match="enable_task_events must be a bool"):
        lumos.method(enable_task_events="no")
    with pytest.raises(TypeError, match="enable_task_events must be a bool"):
        a.g.options(enable_task_events="no")


@lumos.remote(enable_task_events=False)
def quiet_add(x: int, y: int) -> int:
    return x + y


@lumos.remote(enable_task_events=False, max_retries=1, retry_exceptions=True)
def quiet_fail() -> None:
    raise ValueError("quiet task failed")


@lumos.remote
def loud_add(x: int, y: int) -> int:
    return x + y


@lumos.remote(enable_task_events=False)
def quiet_outer(x: int) -> int:
    return lumos.get(loud_add.remote(x, 1), timeout=30)  # its own option: recorded


@lumos.remote(enable_task_events=False)
class QuietActor:
    def value(self) -> int:
        return 5

    @lumos.method(enable_task_events=True)  # overrides the actor's option, as in Ray
    def traced(self) -> int:
        return 6


@lumos.remote
class MixedActor:
    @lumos.method(enable_task_events=False)
    def quiet(self, x: int) -> int:
        return x * 10

    def loud(self, x: int) -> int:
        return x * 100


def test_enable_task_events_false_records_no_task_events(cluster: lumos.LumosContext) -> None:
    # Ray: a task, method call or actor with enable_task_events=False leaves no trace in the
    # state API (list_tasks, the task graph and the event log all read the GCS's task log);
    # its results, errors, retries and lineage are unchanged.
    quiet_ref = quiet_add.remote(1, 2)
    chained = quiet_add.remote(quiet_ref, 4)  # an argument from a quiet task
    quiet_actor = QuietActor.remote()
    mixed = MixedActor.remote()
    quiet_calls = [quiet_actor.value.remote(), mixed.quiet.remote(2),
                   mixed.loud.options(enable_task_events=False).remote(3), quiet_actor.__ray_ready__.remote()]
    assert lumos.get([quiet_ref, chained] + quiet_calls[:3], timeout=30) == [3, 7, 5, 20, 300]
    lumos.get(quiet_calls[3], timeout=30)
    failed = quiet_fail.remote()
    with pytest.raises(ValueError, match="quiet task failed"):
        lumos.get(failed, timeout=30)
    outer = quiet_outer.remote(10)
    assert lumos.get(outer, timeout=30) == 11
    # Recorded as usual, after the quiet ones (an owner sends its events in order).
    loud = [loud_add.remote(quiet_ref, 1), mixed.loud.remote(1), quiet_actor.traced.remote()]
    assert lumos.get(loud, timeout=30) == [4, 100, 6]
    # Ending the actors flushes their workers' own (RUNNING) events.
    quiet_actor.__ray_terminate__.remote()
    mixed.__ray_terminate__.remote()
    actor_ids = {quiet_actor._actor_id.hex(), mixed._actor_id.hex()}
    wait_for(lambda: {a["actor_id"] for a in lumos.state.list_actors()
                      if a["actor_id"] in actor_ids and a["state"] == "DEAD"} == actor_ids, 15)
    loud_ids = {r.task_id().hex() for r in loud}

    outer_id = outer.task_id().hex()

    def rows() -> list[dict[str, Any]]:
        found = lumos.state.list_tasks()
        done = {t["task_id"] for t in found if t["task_id"] in loud_ids and t["state"] == "FINISHED"}
        nested = [t for t in found if t["parent_task_id"] == outer_id and t["state"] == "FINISHED"]
        return found if done == loud_ids and nested else []

    found = {t["task_id"]: t for t in wait_for(rows, 15)}
    quiet_ids = {r.task_id().hex() for r in [quiet_ref, chained, failed, outer] + quiet_calls}
    assert not quiet_ids & set(found), [found[i] for i in quiet_ids & set(found)]
    # A task submitted by a quiet task follows its own option: recorded, its parent absent.
    assert [t["name"] for t in found.values() if t["parent_task_id"] == outer_id] == ["loud_add"]
    # Of the quiet actor only the call that opts in (not even its creation); the other's
    # creation and loud calls.
    quiet_names = {t["name"] for t in found.values() if t["actor_id"] == quiet_actor._actor_id.hex()}
    assert quiet_names == {"QuietActor.traced"}
    mixed_names = {t["name"] for t in found.values() if t["actor_id"] == mixed._actor_id.hex()}
    assert mixed_names == {"MixedActor.__init__", "MixedActor.loud", "MixedActor.__ray_terminate__"}


def test_task_spec_from_an_older_peer_records_task_events() -> None:
    import msgpack

    from lumos._private.protocol import messages as m

    spec = m.TaskSpec(b"t" * 16, b"j" * 4, b"p" * 16, 0, "f", b"f" * 16, "mod.f", b"", [], [], 1, {}, 0, 0,
                      None, m.Address(b"n" * 16, b"w" * 16, "", "127.0.0.1", 1), 0, None)
    fields = list(m.TaskSpec._fields_of(spec))
    assert fields[-1] is True  # enable_task_events is the last field: old frames lack it
    old = msgpack.packb([m.NOTIFY, 1, msgpack.ExtType(m.TaskSpec._code, msgpack.packb(
        fields[:-1], default=m._default, use_bin_type=True))], use_bin_type=True)
    decoded = m.decode(old)[2]
    assert decoded.enable_task_events is True and decoded == spec


# ----------------------------------------------------------------------------- placement groups


@lumos.remote
def current_group() -> str | None:
    pg = get_current_placement_group()
    return pg.id.hex() if pg is not None else None


@lumos.remote
def parent_in_group() -> tuple[str | None, str | None, str | None]:
    inside = current_group.remote()
    outside = current_group.options(
        scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None)).remote()
    default = current_group.options(scheduling_strategy="DEFAULT").remote()  # as in Ray: not captured
    return lumos.get(inside, timeout=30), lumos.get(outside, timeout=30), lumos.get(default, timeout=30)


def test_placement_group_none_schedules_outside_any_group(cluster: lumos.LumosContext) -> None:
    none = PlacementGroupSchedulingStrategy(placement_group=None)
    assert lumos.get(current_group.options(scheduling_strategy=none).remote(), timeout=30) is None
    pg = placement_group([{"CPU": 1}])
    try:
        assert pg.wait(30)
        strategy = PlacementGroupSchedulingStrategy(pg, placement_group_capture_child_tasks=True)
        inside, outside, default = lumos.get(
            parent_in_group.options(scheduling_strategy=strategy, num_cpus=0).remote(), timeout=60)
        assert inside == pg.id.hex() and outside is None and default is None
    finally:
        remove_placement_group(pg)


# ----------------------------------------------------------------------------- cancellation


@lumos.remote
class Patient:
    def __init__(self) -> None:
        self.started = False

    async def wait_long(self) -> str:
        self.started = True
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "caught the cancel"
        return "slept"

    async def is_started(self) -> bool:
        return self.started


def test_cancelled_async_call_that_catches_cancelled_error_still_raises_task_cancelled(
        cluster: lumos.LumosContext) -> None:
    a = Patient.remote()
    ref = a.wait_long.remote()
    wait_for(lambda: lumos.get(a.is_started.remote(), timeout=30), timeout_s=30)
    lumos.cancel(ref)
    with pytest.raises(TaskCancelledError):
        lumos.get(ref, timeout=30)
    assert lumos.get(a.is_started.remote(), timeout=30)  # the actor lives on


# ----------------------------------------------------------------------------- generators


class Halfway(Exception):
    pass


@lumos.remote(num_returns=3, max_retries=0)
def two_then_raise() -> Iterator[int]:
    yield 10
    yield 20
    raise Halfway("stopped after two")


@lumos.remote
class Yielder:
    @lumos.method(num_returns=3)
    def two_then_raise(self) -> Iterator[int]:
        yield 1
        yield 2
        raise Halfway("method stopped after two")


def test_generator_with_fixed_num_returns_keeps_values_yielded_before_its_error(
        cluster: lumos.LumosContext) -> None:
    for refs, first in ((two_then_raise.remote(), [10, 20]), (Yielder.remote().two_then_raise.remote(), [1, 2])):
        assert lumos.get(refs[:2], timeout=30) == first
        with pytest.raises(Halfway, match="stopped after two"):
            lumos.get(refs[2], timeout=30)


@lumos.remote(num_returns=3, max_retries=0)
def yields(n: int) -> Iterator[int]:
    yield from range(n)


@lumos.remote
class YieldsToo:
    @lumos.method(num_returns=2)
    def one(self) -> Iterator[int]:
        yield 1


def test_a_generator_yielding_fewer_values_than_num_returns_fails_them_all_and_more_are_dropped(
        cluster: lumos.LumosContext) -> None:
    # (its missing returns waited forever before: nothing ever completed them)
    for refs, count in ((yields.remote(2), 2), (yields.remote(0), 0), (YieldsToo.remote().one.remote(), 1)):
        for ref in refs:
            with pytest.raises(ValueError, match=f"generator yielded {count} value"):
                lumos.get(ref, timeout=30)
    assert lumos.get(list(yields.remote(5)), timeout=30) == [0, 1, 2]


@lumos.remote(num_returns=1)
def yields_one() -> Iterator[int]:
    yield 42


@lumos.remote
class YieldsOne:
    @lumos.method(num_returns=1)
    def seven(self) -> Iterator[int]:
        yield 7


def test_a_generator_with_num_returns_1_returns_its_value(cluster: lumos.LumosContext) -> None:
    # (lumos stored the generator object itself, and its pickling failed the task)
    assert lumos.get(yields_one.remote(), timeout=30) == 42
    assert lumos.get(YieldsOne.remote().seven.remote(), timeout=30) == 7
    assert lumos.get(lumos.remote(lambda: (i for i in [5])).remote(), timeout=30) == 5


@lumos.remote
class ShortReplies:
    def sabotage_next_reply(self) -> None:
        """This process's next reply of several values carries only the first."""
        from lumos._private import worker_context
        ex = worker_context.core_worker.executor
        store = ex._store_returns

        def first_only(spec: Any, result: Any) -> Any:
            if spec.num_returns < 2:
                return store(spec, result)
            del ex._store_returns
            return store(spec, result)[:1]
        ex._store_returns = first_only

    @lumos.method(num_returns=2)
    def pair(self) -> tuple[int, int]:
        return 1, 2


def test_a_reply_missing_return_values_fails_the_missing_ones_at_the_owner(cluster: lumos.LumosContext) -> None:
    actor = ShortReplies.remote()
    lumos.get(actor.sabotage_next_reply.remote(), timeout=30)
    first, second = actor.pair.remote()
    assert lumos.get(first, timeout=30) == 1
    with pytest.raises(lumos.exceptions.LumosSystemError, match="sent 1 of its 2 return values"):
        lumos.get(second, timeout=30)
    assert lumos.get(list(actor.pair.remote()), timeout=30) == [1, 2]


@lumos.remote(num_returns="dynamic")
def split(n: int) -> Iterator[int]:
    for i in range(n):
        yield i * i


@lumos.remote(num_returns="dynamic", max_retries=0)
def split_then_raise() -> Iterator[str]:
    yield "a"
    raise Halfway("dynamic stopped")


@lumos.remote
def total(gen: lumos.DynamicObjectRefGenerator) -> int:
    return sum(lumos.get(list(gen), timeout=30))


def test_num_returns_dynamic_returns_a_dynamic_object_ref_generator(cluster: lumos.LumosContext) -> None:
    gen = lumos.get(split.remote(4), timeout=30)
    assert isinstance(gen, lumos.DynamicObjectRefGenerator) and len(gen) == 4
    refs = list(gen)
    assert all(isinstance(r, lumos.ObjectRef) for r in refs)
    assert lumos.get(refs, timeout=30) == [0, 1, 4, 9]
    assert lumos.get(total.remote(split.remote(3)), timeout=30) == 0 + 1 + 4  # passed on to a task
    # as in Ray: the values before an error stay; the error is one more, final ref
    last = list(lumos.get(split_then_raise.remote(), timeout=30))
    assert lumos.get(last[0], timeout=30) == "a" and len(last) == 2
    with pytest.raises(Halfway, match="dynamic stopped"):
        lumos.get(last[1], timeout=30)
    with pytest.raises(ValueError, match="remote functions only"):
        lumos.method(num_returns="dynamic")


# ----------------------------------------------------------------------------- audit additions


@lumos.remote
def context_facts() -> dict[str, Any]:
    ctx = lumos.get_runtime_context()
    return {"function": ctx.get_task_function_name(), "resources": ctx.get_resource_ids(),
            "session": ctx.get_session_name(), "temp": ctx.get_temp_dir(), "labels": ctx.get_node_labels(),
            "env": ctx.get_runtime_env_string(), "capture": ctx.should_capture_child_tasks_in_placement_group}


def test_runtime_context_getters_of_ray(cluster: lumos.LumosContext) -> None:
    facts = lumos.get(context_facts.options(runtime_env={"env_vars": {"A": "1"}}).remote(), timeout=30)
    assert facts["function"].endswith("context_facts")
    assert "CPU" in facts["resources"] or facts["resources"] == {}
    session_dir = cluster.address_info["session_dir"]
    assert facts["temp"] == session_dir and session_dir.rstrip("/").endswith(facts["session"])
    # (a node started without labels has Ray's default one)
    assert facts["labels"] == {"ray.io/node-id": cluster.address_info["node_id"]} and facts["capture"] is False
    assert '"A": "1"' in facts["env"]
    assert lumos.get_runtime_context().get_task_function_name() is None  # the driver runs no task


@lumos.remote
def slow_square(x: int) -> int:
    import time
    time.sleep(0.05 * (x % 3))
    return x * x


def test_as_completed_and_map_unordered_yield_every_result(cluster: lumos.LumosContext) -> None:
    refs = [slow_square.remote(i) for i in range(7)]
    assert sorted(lumos.util.as_completed(refs, chunk_size=2, timeout=30)) == [i * i for i in range(7)]
    got = list(lumos.util.as_completed(refs, chunk_size=3, yield_obj_refs=True))
    assert sorted(got, key=lambda r: r.hex()) == sorted(refs, key=lambda r: r.hex())
    assert sorted(lumos.util.map_unordered(slow_square, range(9), backpressure_size=3, chunk_size=2)) == \
        [i * i for i in range(9)]
    with pytest.raises(ValueError, match="chunk_size"):
        next(lumos.util.as_completed(refs, chunk_size=0))


def test_util_state_has_rays_signatures_and_attribute_rows(cluster: lumos.LumosContext) -> None:
    from lumos.util import state
    a = Self.remote()
    lumos.get(a.ping.remote(), timeout=30)
    rows = state.list_actors(filters=[("class_name", "=", "Self")], limit=1000, timeout=10, detail=True)
    assert rows and rows[0].state == rows[0]["state"]
    one = state.get_actor(rows[0].actor_id)
    assert one is not None and one.class_name == "Self"
    actors = state.summarize_actors()["cluster"]  # Ray's shape
    assert actors["summary"]["Self"]["class_name"] == "Self" and actors["summary"]["Self"]["state_counts"]["ALIVE"] >= 1
    assert actors["total_actors"] >= 1 and actors["summary_by"] == "class"
    tasks = wait_for(lambda: (s := state.summarize_tasks()["cluster"])["summary"].get("Self.ping") and s, 10)
    assert tasks["summary"]["Self.ping"]["type"] == "ACTOR_TASK" and tasks["summary_by"] == "func_name"
    assert tasks["summary"]["Self.ping"]["func_or_class_name"] == "Self.ping"
    assert tasks["summary"]["Self.ping"]["state_counts"]["FINISHED"] >= 1 and tasks["total_actor_tasks"] >= 1
    node = state.list_nodes()[0]
    assert state.get_node(node.node_id).node_id == node.node_id
    with pytest.raises(ValueError, match="connected to"):
        state.list_tasks(address="10.0.0.1:6379")
    chunks = list(state.get_log(actor_id=rows[0].actor_id, tail=5, suffix="log"))
    assert len(chunks) == 1 and len(chunks[0].splitlines()) <= 5
    with pytest.raises(NotImplementedError, match=r"get_log\(follow=...\) is not implemented in lumos; name"):
        state.get_log(actor_id=rows[0].actor_id, follow=True)


def test_util_state_rows_carry_rays_field_names(cluster: lumos.LumosContext) -> None:
    """Ray's names for fields lumos's rows hold under their own (ray_namespace, status,
    worker_type, is_alive, *_time_ms, creator_job_id), readable and filterable (a filter
    on them was a ValueError)."""
    from lumos.util import state
    a = Self.remote()
    lumos.get(a.ping.remote(), timeout=30)
    namespace = lumos.get_runtime_context().namespace
    actors = state.list_actors(filters=[("ray_namespace", "=", namespace), ("class_name", "=", "Self")], limit=1000)
    assert actors and actors[0].ray_namespace == actors[0].namespace and actors[0].start_time_ms > 0
    job = state.list_jobs(filters=[("status", "=", "RUNNING")])
    assert job and job[0].status == job[0].state
    assert job[0].type == "DRIVER" and job[0].submission_id is None
    assert job[0].driver_info == {"id": job[0].job_id, "node_ip_address": job[0].driver_ip,
                                  "pid": str(job[0].driver_pid)}
    workers = state.list_workers(filters=[("worker_type", "=", "DRIVER"), ("is_alive", "=", True)], limit=1000)
    assert workers and all(w.is_driver and w.state == "ALIVE" for w in workers)
    tasks = state.list_tasks(filters=[("func_or_class_name", "!=", "")], limit=5)
    assert tasks and all(t.creation_time_ms > 0 for t in tasks)
    task = state.get_task(tasks[-1].task_id)
    assert task is not None and task.creation_time_ms == tasks[-1].creation_time_ms
    # Ray's fields lumos's rows lacked: an object's size, reference type and holder
    # (pid, ip, driver or worker), a task's worker pid, a node's name, a worker's address.
    pids = {w.worker_id: w.pid for w in state.list_workers(limit=1000)}
    assert task.language == "PYTHON" and task.worker_pid == pids[task.worker_id]
    assert task.call_site is None and actors[0].call_site is None  # (as Ray's without creation sites)
    held = lumos.put(b"x" * 200_000)
    rows = state.list_objects(filters=[("object_id", "=", held.hex()), ("type", "=", "DRIVER")])
    assert len(rows) == 1 and rows[0].object_size == rows[0].size_bytes >= 200_000
    assert rows[0].reference_type == "LOCAL_REFERENCE" and rows[0].pid == os.getpid()
    assert rows[0].ip == "127.0.0.1"
    node = state.list_nodes(filters=[("node_name", "=", "127.0.0.1")])
    assert node and node[0].start_time_ms > 0 and node[0].state_message is None
    worker = state.list_workers(filters=[("ip", "=", "127.0.0.1"), ("worker_type", "=", "WORKER")], limit=1000)
    assert worker and all(w.worker_launch_time_ms == w.start_time_ms > 0 for w in worker)


def test_state_filters_name_real_fields_and_limits_hold(cluster: lumos.LumosContext) -> None:
    # A filter on a field the rows lack (a typo) matched nothing in silence; limit=-1
    # ("all", as get_* use it) made list_tasks return nothing; summarize_objects read a
    # size field the rows do not have and always said 0 bytes.
    from lumos.util import state

    for lister, what in ((state.list_tasks, "tasks"), (state.list_actors, "actors"), (state.list_nodes, "nodes"),
                         (state.list_workers, "workers"), (state.list_objects, "objects"), (state.list_jobs, "jobs")):
        with pytest.raises(ValueError, match=f"{what} have no field 'sate' to filter on; their fields: .*state"):
            lister(filters=[("sate", "=", "x")])
    with pytest.raises(ValueError, match="unsupported filter operator '<'"):
        state.list_nodes(filters=[("state", "<", "x")])
    with pytest.raises(ValueError, match="limit must be >= 0, got -2"):
        lumos.state.list_tasks(limit=-2)
    a = Self.remote()
    assert lumos.get(a.ping.remote(), timeout=30) == "pong"
    assert state.list_tasks(filters=[("state", "=", "FINISHED")], limit=-1)
    alive = state.list_actors(filters=[("state", "=", "alive")])  # (case aside, as in Ray)
    assert alive and all(r.state == "ALIVE" for r in alive)
    assert not [r for r in state.list_actors(filters=[("state", "!=", "Alive")]) if r.state == "ALIVE"]
    assert lumos.state.list_objects(limit=0) == []
    keep = lumos.put(b"x" * (1 << 20))
    objects = state.summarize_objects()["cluster"]
    assert objects["total_size_mb"] >= 1 and objects["callsite_enabled"] is False
    group = objects["summary"]["disabled"]
    assert group["total_objects"] == objects["total_objects"] >= 1 and group["total_num_workers"] >= 1
    assert group["ref_type_counts"].get("LOCAL_REFERENCE", 0) >= 1
    del keep, a


def test_object_ref_and_actor_class_extras_of_ray(cluster: lumos.LumosContext) -> None:
    ref = lumos.put(5)
    assert not ref.is_nil() and ref.size() == len(ref.binary()) and ref.call_site() == ""
    # A ref's task id compares by value (two views of one id were unequal), as Ray's TaskID.
    assert ref.task_id() == ref.task_id() and len({ref.task_id(), ref.task_id()}) == 1
    assert not ref.task_id().is_nil()

    async def read() -> int:
        return await ref.as_future()

    assert asyncio.run(read()) == 5
    with pytest.raises(lumos.actor.ActorClassInheritanceException, match="cannot be inherited"):
        class Sub(Self):  # type: ignore[misc,valid-type]
            pass
    assert lumos.util.placement_group.__module__ == "lumos.util.placement_group"
    from lumos.util.placement_group import PlacementGroup
    assert PlacementGroup.empty().is_empty


def test_log_once_and_inspect_serializability() -> None:
    import threading
    key = "test_log_once_and_inspect_serializability"
    assert lumos.util.log_once(key) and not lumos.util.log_once(key)
    lock = threading.Lock()

    def uses_lock() -> None:
        with lock:
            pass

    report = io.StringIO()
    ok, failures = lumos.util.inspect_serializability(uses_lock, name="uses_lock", print_file=report)
    # As Ray's: each failure names the member, holds it and the object it was found in.
    assert not ok and [(f.name, f.obj, f.parent) for f in failures] == [("lock", lock, uses_lock)]
    assert "uses_lock -> lock (lock) does not pickle" in report.getvalue(), report.getvalue()
    assert lumos.util.inspect_serializability(plain, print_file=report)[0]
    assert report.getvalue().splitlines()[-1] == "Checking serializability of plain: serializable"


def test_inspect_serializability_prints_its_report_to_stdout_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    import threading
    lock = threading.Lock()
    ok, _ = lumos.util.inspect_serializability({"held": lock}, name="config")
    assert not ok
    assert "config -> 'held' (lock) does not pickle" in capsys.readouterr().out


@pytest.mark.parametrize("named", [False, True])
def test_a_quiet_actors_creation_arguments_are_released_with_it(cluster: lumos.LumosContext, named: bool) -> None:
    # The creation task's store arguments stay pinned while the actor lives (a restart
    # reruns it), and are released when it ends, with task events on or off.
    from lumos._private import worker_context

    cw = worker_context.core_worker
    assert cw is not None
    arg = lumos.put(b"x" * (1 << 20))
    oid = arg.binary()
    opts: dict[str, Any] = {"name": f"quiet-creation-args-{named}"} if named else {}
    actor = _Holder.options(**opts).remote(arg)
    assert lumos.get(actor.size.remote(), timeout=30) == 1 << 20
    del arg
    cw.drain_refs()
    assert oid in cw.objects.entries  # the actor's creation still pins it
    lumos.kill(actor)
    del actor
    wait_for(lambda: not (cw.drain_refs() or oid in cw.objects.entries), 15)


@lumos.remote(enable_task_events=False)
class _Holder:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def size(self) -> int:
        return len(self.data)


# ----------------------------------------------------------------------------- declaring


def test_async_def_cannot_be_a_remote_task() -> None:
    """As in Ray: refused at the decorator (it ran, then failed pickling a coroutine)."""
    async def fetch(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="'async def' cannot be a remote task"):
        lumos.remote(fetch)
    with pytest.raises(ValueError, match="'async def'"):
        lumos.remote(num_cpus=1)(fetch)


def test_streaming_or_dynamic_returns_need_a_generator_function(cluster: lumos.LumosContext) -> None:
    """As in Ray: a ValueError at .remote() (the worker's TypeError came from get())."""
    @lumos.remote
    def not_a_generator() -> int:
        return 1

    for value in ("streaming", "dynamic"):
        with pytest.raises(ValueError, match="needs a generator function"):
            not_a_generator.options(num_returns=value).remote()
    assert lumos.get(not_a_generator.remote(), timeout=30) == 1


@lumos.remote
class BareMethod:
    @lumos.method
    def hello(self) -> str:
        return "hi"


def test_bare_method_decorator_is_accepted(cluster: lumos.LumosContext) -> None:
    """Ray accepts @ray.method with no arguments (lumos raised TypeError at class definition)."""
    assert lumos.get(BareMethod.remote().hello.remote(), timeout=30) == "hi"


def test_runtime_env_config_is_accepted(cluster: lumos.LumosContext) -> None:
    """Ray's runtime_env['config'] (setup_timeout_seconds, eager_install) is accepted; there
    is no setup in lumos for it to govern. Unknown keys in it are a ValueError."""
    @lumos.remote
    def env() -> str | None:
        import os
        return os.environ.get("LUMOS_T")

    opts = {"env_vars": {"LUMOS_T": "1"}, "config": {"setup_timeout_seconds": 10, "eager_install": True}}
    assert lumos.get(env.options(runtime_env=opts).remote(), timeout=30) == "1"
    with pytest.raises(ValueError, match="unknown"):
        env.options(runtime_env={"config": {"bogus": 1}})
    with pytest.raises(TypeError, match="config"):
        env.options(runtime_env={"config": 5})


# ----------------------------------------------------------------------------- scheduling


def test_hard_affinity_that_can_never_be_met_raises_unschedulable(cluster: lumos.LumosContext) -> None:
    """As in Ray: NodeAffinitySchedulingStrategy(soft=False) to a node that is gone, or to a
    live one too small for the request, raises TaskUnschedulableError from get() (too
    small: it waited for ever, warned that a fitting node might join), and an actor's calls
    raise ActorUnschedulableError, which as in Ray is not a RayActorError."""
    from lumos.exceptions import ActorUnschedulableError, TaskUnschedulableError
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @lumos.remote
    def f() -> int:
        return 1

    @lumos.remote
    class Pinned:
        def m(self) -> int:
            return 1

    here = lumos.get_runtime_context().get_node_id()
    gone = NodeAffinitySchedulingStrategy("ab" * (len(here) // 2), soft=False)
    small = NodeAffinitySchedulingStrategy(here, soft=False)
    for strategy, cpus, match in ((gone, 1, "is not alive"), (small, 10_000, "less than")):
        with pytest.raises(TaskUnschedulableError, match=match):
            lumos.get(f.options(num_cpus=cpus, scheduling_strategy=strategy).remote(), timeout=30)
        actor = Pinned.options(num_cpus=cpus, scheduling_strategy=strategy).remote()
        with pytest.raises(ActorUnschedulableError, match=match) as info:
            lumos.get(actor.m.remote(), timeout=30)
        assert not isinstance(info.value, RayActorError)  # (as in Ray: a RayError only)
    # What fits runs there.
    assert lumos.get(f.options(scheduling_strategy=small).remote(), timeout=30) == 1


@lumos.remote
class WithClassAttributes:
    CONST = 7

    def __init__(self) -> None:
        self.items = [1, 2, 3]

    @staticmethod
    def helper(x: int) -> int:
        return 2 * x

    @classmethod
    def make(cls) -> int:
        return cls.CONST

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> int:
        return self.items[i]

    def __getstate__(self) -> dict[str, Any]:
        return {}

    def m(self) -> int:
        return 1


def test_the_classs_attributes_read_through_the_actor_class() -> None:
    """As in Ray: constants, static and class methods through the decorated name (lumos
    raised AttributeError); a method read there is the plain function; a name the class
    lacks is still an AttributeError."""
    assert WithClassAttributes.CONST == 7 and WithClassAttributes.helper(3) == 6
    assert WithClassAttributes.make() == 7 and callable(WithClassAttributes.m)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        WithClassAttributes.nope  # noqa: B018


def test_an_actors_own_special_methods_are_callable(cluster: lumos.LumosContext) -> None:
    """As in Ray: handle.__len__.remote() and the like call the actor's (lumos raised
    AttributeError for every special method but __call__). The object protocol stays the
    handle's own: it still pickles and copies as a handle."""
    import copy
    import pickle
    h = WithClassAttributes.remote()
    assert lumos.get([h.__len__.remote(), h.__getitem__.remote(1), h.m.remote()], timeout=30) == [3, 2, 1]
    assert pickle.loads(pickle.dumps(h)) == h and copy.copy(h) == h


def test_wrong_arguments_raise_what_ray_raises_too(cluster: lumos.LumosContext) -> None:
    """get() of a non-ref and kill() of a non-actor raise ValueError in Ray, TypeError in
    lumos before: now an error that is both; get_actor('') is a ValueError, as in Ray."""
    for call in (lambda: lumos.get(5), lambda: lumos.get([lumos.put(1), 5]), lambda: lumos.kill(lumos.put(1)),
                 lambda: lumos.kill("name")):
        for cls in (ValueError, TypeError):
            with pytest.raises(cls):
                call()
    with pytest.raises(ValueError, match="empty"):
        lumos.get_actor("")


def test_resource_figures_are_floats_and_nodes_have_rays_keys(cluster: lumos.LumosContext) -> None:
    """As in Ray: cluster_resources() and available_resources() give floats (lumos gave
    ints for some, object_store_memory among them); nodes() rows carry NodeName and
    DeathReasonMessage."""
    for figures in (lumos.cluster_resources(), lumos.available_resources()):
        assert figures["object_store_memory"] > 0
        assert all(type(v) is float for v in figures.values()), figures
    (node,) = [n for n in lumos.nodes() if n["Alive"]]
    assert node["NodeName"] == node["NodeManagerAddress"] and node["DeathReasonMessage"] == ""


def _unpickle_boom() -> None:
    raise RuntimeError("boom on unpickle")


class _FailsToUnpickle:
    def __reduce__(self) -> Any:
        return (_unpickle_boom, ())


def test_a_value_that_fails_to_unpickle_raises_a_system_error(cluster: lumos.LumosContext) -> None:
    """As in Ray: RaySystemError (lumos's DeserializationError subclassed only Exception,
    so `except ray.exceptions.RaySystemError` missed it)."""
    with pytest.raises(lumos.exceptions.RaySystemError, match="boom on unpickle"):
        lumos.get(lumos.put(_FailsToUnpickle()), timeout=30)


_SELF_NAMING_ACTOR = textwrap.dedent("""
    import lumos

    @lumos.remote
    class Node:
        def __init__(self, depth):
            self.depth = depth

        def spawn(self):
            if self.depth > 0:
                return lumos.get(Node.remote(self.depth - 1).spawn.remote()) + 1
            return 1

        def sibling(self):
            return Node.remote(0)

    lumos.init(num_cpus=2, include_dashboard=False)
    root = Node.remote(2)
    print("depth", lumos.get(root.spawn.remote(), timeout=60))
    print("sibling", lumos.get(lumos.get(root.sibling.remote(), timeout=60).spawn.remote(), timeout=60))
    lumos.shutdown()
""")


@pytest.mark.timeout(120)
def test_an_actor_class_of_a_script_that_names_itself_works_in_its_workers(tmp_path: Any) -> None:
    """As in Ray: a class defined in __main__ (pickled by value) whose methods create more
    of it. Unpickled in a worker while cloudpickle was still filling the class in, the
    actor class read an empty class: `Node() too many positional arguments`, and handles
    it made had no methods."""
    script = tmp_path / "tree.py"
    script.write_text(_SELF_NAMING_ACTOR)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=100,
                         cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "depth 3" in out.stdout and "sibling 1" in out.stdout, out.stdout


def test_refs_handles_and_generators_take_type_parameters_in_annotations() -> None:
    # Ray's classes are generic: `def f(x: ray.ObjectRef[int])` failed at def time here
    # (in a module without `from __future__ import annotations`, which this one has).
    code = ("import lumos\n"
            "def consume(ref: lumos.ObjectRef[int], actor: lumos.actor.ActorHandle['A'],\n"
            "            gen: lumos.ObjectRefGenerator[int]) -> lumos.ObjectRef[str]:\n"
            "    return ref\n")
    space: dict[str, Any] = {}
    exec(compile(code, "<annotated>", "exec", dont_inherit=True), space)
    hints = space["consume"].__annotations__
    assert hints["ref"].__origin__ is lumos.ObjectRef and hints["return"].__args__ == (str,)
    assert hints["actor"].__origin__ is lumos.actor.ActorHandle
    assert hints["gen"].__origin__ is lumos.ObjectRefGenerator
