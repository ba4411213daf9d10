"""What failures leave behind: store space of failed attempts, object-store accounting,
the state API's rows, errors that name what failed, and calls after the GCS is gone."""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

import pytest

import lumos
from lumos._private import worker_context
from lumos._private.protocol import messages as m
from tests.conftest import lumos_children, process_gone, wait_for

MIB = 1024 * 1024


class BadReduce:
    def __reduce__(self) -> Any:
        raise RuntimeError("BadReduce refuses to be pickled")


def _store_objects() -> int:
    """Objects in this node's store right now (files, not pooled slots)."""
    return worker_context.require().call_raylet(m.GetNodeStats())["store"]["num_objects"]


@pytest.mark.parametrize("third", ["unpicklable", "too_big"])
def test_failed_multi_return_attempt_frees_the_returns_it_stored(fresh_cluster, third: str) -> None:
    import numpy as np
    # Without spilling, a store that is full stays full: the third return cannot be made.
    fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False,
                  _system_config={"object_spilling_enabled": False})

    @lumos.remote(num_returns=3, max_retries=0)
    def two_big_then_bad(third: str) -> Any:
        last = BadReduce() if third == "unpicklable" else np.ones(30 * MIB // 8)  # no room left for it
        return np.ones(20 * MIB // 8), np.ones(20 * MIB // 8), last

    before = _store_objects()
    refs = two_big_then_bad.remote(third)
    error, match = ((TypeError, r"return value 3 of two_big_then_bad could not be serialized: "
                                r".*a `BadReduce` whose `__reduce__` raised")
                    if third == "unpicklable" else (MemoryError, "object store is full"))
    for ref in refs:
        with pytest.raises(error, match=match):
            lumos.get(ref, timeout=60)
    # The two returns written before the third failed are gone from the store.
    wait_for(lambda: _store_objects() == before, 10)


def test_pooled_free_slots_count_as_available_store_memory(fresh_cluster) -> None:
    import numpy as np
    fresh_cluster(num_cpus=1, object_store_memory=64 * MIB, include_dashboard=False)
    total = lumos.cluster_resources()["object_store_memory"]
    refs = [lumos.put(np.ones(5 * MIB // 8)) for _ in range(3)]
    assert lumos.available_resources()["object_store_memory"] < total - 14 * MIB
    del refs
    # Freed values keep their files as reusable slots; those are free space, not used,
    # and are reported as what they are: /dev/shm held for reuse.
    wait_for(lambda: lumos.available_resources()["object_store_memory"] == total, 10)
    wait_for(lambda: [n for n in lumos.state.list_nodes() if n["object_store_used_bytes"] == 0
                      and n["object_store_pooled_bytes"] >= 15 * MIB], 10)
    from prometheus_client.parser import text_string_to_metric_families
    pooled = [s.value for f in text_string_to_metric_families(lumos.state.prometheus_text())
              for s in f.samples if s.name == "lumos_object_store_pooled_bytes"]
    assert len(pooled) == 1 and pooled[0] >= 15 * MIB


def test_serialization_errors_name_the_argument_and_the_failing_class(fresh_cluster) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False)
    @lumos.remote
    def train(data: Any, cfg: Any, *, opts: Any = None) -> int:
        return 1

    with pytest.raises(TypeError, match=r"argument 2 \(`cfg`\) of train\(\): a `BadReduce` whose "
                                        r"`__reduce__` raised RuntimeError: BadReduce refuses") as info:
        train.remote([1, 2], BadReduce())

    holder = {"inner": [threading.Lock()]}
    with pytest.raises(TypeError, match=r"keyword argument `opts` of train\(\): at `\['inner'\]\[0\]`, "
                                        r"a `lock` that cannot be pickled"):
        train.remote(1, 2, opts=holder)

    @lumos.remote
    class Model:
        def __init__(self, size: int, weights: Any) -> None:
            self.size = size

        def fit(self, batch: Any) -> int:
            return 1

    with pytest.raises(TypeError, match=r"argument 2 \(`weights`\) of Model.__init__\(\): a `BadReduce`"):
        Model.remote(3, BadReduce())
    model = Model.remote(3, None)
    with pytest.raises(TypeError, match=r"argument 1 of Model.fit\(\): a `BadReduce`"):
        model.fit.remote(BadReduce())
    assert lumos.get(model.fit.remote(1), timeout=30) == 1


def test_list_tasks_rows_are_ordered_and_complete(fresh_cluster) -> None:
    fresh_cluster(num_cpus=2, include_dashboard=False)
    @lumos.remote
    def quick(i: int) -> int:
        return i

    @lumos.remote(max_restarts=0, max_task_retries=2)
    class Fragile:
        def crash(self) -> None:
            os._exit(1)

    refs = [quick.remote(i) for i in range(20)]
    assert lumos.get(refs, timeout=30) == list(range(20))
    fragile = Fragile.remote()
    with pytest.raises(lumos.exceptions.ActorDiedError):
        lumos.get(fragile.crash.remote(), timeout=30)
    rows = lumos.state.list_tasks()
    submitted = [r["submitted_time"] for r in rows]
    assert submitted == sorted(submitted)
    finished = [r for r in rows if r["name"] == "quick"]
    assert len(finished) == 20
    for row in finished:
        assert row["state"] == "FINISHED"
        assert row["start_time"] is not None and row["submitted_time"] <= row["start_time"] <= row["end_time"]
        times = [t for _s, t, _a in row["events"]]
        assert times == sorted(times)
    (crash,) = [r for r in rows if r["name"] == "Fragile.crash"]
    # The actor died for good: the call was never run again.
    assert crash["state"] == "FAILED" and crash["attempt_number"] == 0, crash


@pytest.mark.timeout(90)
def test_calls_fail_with_a_typed_error_when_the_gcs_dies(fresh_cluster) -> None:
    fresh_cluster(num_cpus=2, include_dashboard=False)

    @lumos.remote
    class Sleeper:
        def nap(self, s: float) -> float:
            time.sleep(s)
            return s

    @lumos.remote
    def inc(x: int) -> int:
        return x + 1

    actor = Sleeper.remote()
    assert lumos.get(actor.nap.remote(0), timeout=30) == 0
    pending = actor.nap.remote(600)
    (gcs,) = [p for p in lumos_children() if "lumos._private.gcs.server" in " ".join(p.cmdline())]
    raylets = [p.pid for p in lumos_children() if "lumos._private.raylet.server" in " ".join(p.cmdline())]
    os.kill(gcs.pid, signal.SIGKILL)
    wait_for(lambda: all(process_gone(pid) for pid in raylets), 20)
    start = time.monotonic()
    errors = []
    for ref in (pending, actor.nap.remote(0), inc.remote(1)):
        with pytest.raises(lumos.exceptions.ClusterUnavailableError) as info:
            lumos.get(ref, timeout=30)
        errors.append(info.value)
    for call in (lumos.nodes, lumos.state.list_tasks, lumos.available_resources):
        with pytest.raises(lumos.exceptions.ClusterUnavailableError, match="lost") as info:
            call()
        assert isinstance(info.value, ConnectionError) and isinstance(info.value, lumos.exceptions.RaySystemError)
    assert time.monotonic() - start < 20


def test_an_idle_worker_that_owns_stored_objects_is_not_reaped() -> None:
    from lumos._private.raylet import scheduler as sc
    s = sc.LocalSchedulerState({"CPU": 1}, 0, 4, 1.0, validate=True)
    for wid in (b"a" * 16, b"b" * 16):
        s.add_starting_worker(wid)
        s.handle(sc.WorkerRegistered(wid), now=0.0)
    s.handle(sc.OwnershipChanged(b"a" * 16, True), now=0.0)
    stops = [a.worker_id for a in s.handle(sc.Ticked(), now=5.0) if isinstance(a, sc.StopWorker)]
    assert stops == [b"b" * 16]
    s.handle(sc.OwnershipChanged(b"a" * 16, False), now=5.0)
    stops = [a.worker_id for a in s.handle(sc.Ticked(), now=10.0) if isinstance(a, sc.StopWorker)]
    assert stops == [b"a" * 16]
