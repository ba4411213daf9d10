"""Placement groups: bundle placement by strategy, reservation on real raylets, tasks and
actors inside bundles (their CPUs, their GPUs), removal, infeasible groups that wait for
a node, and bundles of a dead node placed again.

The pure ``plan_bundles`` is fed node views; everything else runs real node processes
(``lumos.testing.Cluster``).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

import lumos
from lumos._private.gcs.placement_groups import plan_bundles
from lumos._private.raylet import scheduler as sc
from lumos._private.raylet.resources import to_units
from lumos.testing import Cluster
from lumos.util import placement_group, placement_group_table, remove_placement_group
from lumos.util.placement_group import PlacementGroup, PlacementGroupID
from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
from tests.conftest import TEST_CONFIG, check_no_leaks, running_head, wait_for

A, B, C = b"a" * 16, b"b" * 16, b"c" * 16


def _u(**res: float) -> dict[str, int]:
    return {k: to_units(v) for k, v in res.items()}


def _in(pg: Any, index: int = -1) -> PlacementGroupSchedulingStrategy:
    return PlacementGroupSchedulingStrategy(pg, index)


@lumos.remote(num_cpus=1)
def where(sleep_s: float = 0.0) -> tuple[str, float, float]:
    start = time.time()
    time.sleep(sleep_s)
    return lumos.get_runtime_context().get_node_id(), start, time.time()


@lumos.remote(num_cpus=0, num_gpus=1)
def gpus() -> tuple[list[Any], str | None]:
    return lumos.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")


@lumos.remote(num_cpus=0)
def current_group() -> Any:
    return lumos.util.get_current_placement_group()


@lumos.remote(num_cpus=0)
class Probe:
    def node(self) -> str:
        return lumos.get_runtime_context().get_node_id()

    def gpus(self) -> list[Any]:
        return lumos.get_gpu_ids()


def _free(resource: str) -> float:
    return lumos.available_resources().get(resource, 0)


# ----------------------------------------------------------------------------- pure placement


def test_plan_strict_pack_needs_one_node_for_all_bundles() -> None:
    nodes = [(A, _u(CPU=2)), (B, _u(CPU=3))]
    assert plan_bundles("STRICT_PACK", [_u(CPU=1)] * 3, [0, 1, 2], {}, nodes) == {0: B, 1: B, 2: B}
    assert plan_bundles("STRICT_PACK", [_u(CPU=2)] * 2, [0, 1], {}, nodes) is None


def test_plan_pack_prefers_one_node_then_fills_few() -> None:
    nodes = [(A, _u(CPU=2)), (B, _u(CPU=1)), (C, _u(CPU=1))]
    assert plan_bundles("PACK", [_u(CPU=1)] * 2, [0, 1], {}, nodes) == {0: A, 1: A}
    plan = plan_bundles("PACK", [_u(CPU=1)] * 3, [0, 1, 2], {}, nodes)
    assert plan is not None and sorted(plan.values()).count(A) == 2 and len(set(plan.values())) == 2


def test_plan_spread_uses_distinct_nodes_when_it_can() -> None:
    nodes = [(A, _u(CPU=4)), (B, _u(CPU=4))]
    plan = plan_bundles("SPREAD", [_u(CPU=1)] * 2, [0, 1], {}, nodes)
    assert plan is not None and set(plan.values()) == {A, B}
    plan = plan_bundles("SPREAD", [_u(CPU=1)] * 3, [0, 1, 2], {}, nodes)  # more bundles than nodes: still placed
    assert plan is not None and set(plan.values()) == {A, B}


def test_plan_strict_spread_needs_a_node_per_bundle_and_avoids_placed_ones() -> None:
    nodes = [(A, _u(CPU=4)), (B, _u(CPU=4))]
    assert plan_bundles("STRICT_SPREAD", [_u(CPU=1)] * 3, [0, 1, 2], {}, nodes) is None
    assert plan_bundles("STRICT_SPREAD", [_u(CPU=1)] * 2, [1], {0: A}, nodes) == {1: B}
    # Backtracks: the big bundle must take the only node that fits it.
    nodes = [(A, _u(CPU=4)), (B, _u(CPU=1))]
    assert plan_bundles("STRICT_SPREAD", [_u(CPU=1), _u(CPU=3)], [0, 1], {}, nodes) == {0: B, 1: A}


def test_local_scheduler_grants_bundle_leases_from_the_bundle_only() -> None:
    s = sc.LocalSchedulerState({"CPU": 2, "GPU": 2}, 0, 8, 60.0, validate=True)
    pg = b"p" * 16
    acts = s.handle(sc.BundlesRequested(1, pg, [(0, {"CPU": 1, "GPU": 1}), (1, {"CPU": 1, "GPU": 1})]), 0)
    assert acts == [sc.AnswerBundles(1, True, gpu_ids={0: [0], 1: [1]})]
    assert s.available_floats() == {"CPU": 0, "GPU": 0}
    assert s.handle(sc.BundlesRequested(2, b"q" * 16, [(0, {"CPU": 1})]), 0)[0].ok is False
    s.add_starting_worker(b"w1")
    s.add_starting_worker(b"w2")
    s.handle(sc.WorkerRegistered(b"w1"), 0)
    s.handle(sc.WorkerRegistered(b"w2"), 0)
    g1 = s.handle(sc.LeaseRequested(10, b"j", {"CPU": 1, "GPU": 1}, bundle=(pg, 1)), 0)
    g0 = s.handle(sc.LeaseRequested(11, b"j", {"CPU": 1, "GPU": 1}, bundle=(pg, 0)), 0)
    assert [type(a) for a in g1 + g0] == [sc.GrantLease, sc.GrantLease]
    gpu_of = {g1[0].resource_ids["GPU"][0][0], g0[0].resource_ids["GPU"][0][0]}
    assert gpu_of == {0, 1}
    # The bundle is busy: the next request in it waits even if another bundle were free.
    assert s.handle(sc.LeaseRequested(12, b"j", {"CPU": 1}, bundle=(pg, 1)), 0) == []
    fail = s.handle(sc.LeaseRequested(13, b"j", {"CPU": 2}, bundle=(pg, 0)), 0)
    assert isinstance(fail[0], sc.FailLease) and "does not fit" in fail[0].reason
    acts = s.handle(sc.BundlesRemoved(pg), 0)
    assert {a.worker_id for a in acts if isinstance(a, sc.StopWorker)} == {b"w1", b"w2"}
    assert any(isinstance(a, sc.FailLease) and a.request_id == 12 for a in acts)
    assert s.available_floats() == {"CPU": 2, "GPU": 2}


def test_bundle_answer_names_the_node_gpus_each_bundle_got() -> None:
    s = sc.LocalSchedulerState({"CPU": 4, "GPU": 4}, 0, 8, 60.0, validate=True)
    s.handle(sc.BundlesRequested(1, b"a" * 16, [(0, {"GPU": 1})]), 0)  # takes node GPU 0
    pg = b"p" * 16
    acts = s.handle(sc.BundlesRequested(2, pg, [(0, {"CPU": 1}), (1, {"GPU": 2}), (2, {"GPU": 0.5})]), 0)
    assert acts == [sc.AnswerBundles(2, True, gpu_ids={0: [], 1: [1, 2], 2: [3]})]
    # A retried request (the GCS lost the reply) gets the same ids and takes nothing more.
    assert s.handle(sc.BundlesRequested(3, pg, [(1, {"GPU": 2})]), 0) == \
        [sc.AnswerBundles(3, True, gpu_ids={1: [1, 2]})]
    assert s.available_floats()["GPU"] == 0.5
    refused = s.handle(sc.BundlesRequested(4, b"q" * 16, [(0, {"GPU": 1})]), 0)
    assert refused[0].ok is False and refused[0].gpu_ids == {}


# ----------------------------------------------------------------------------- one node


@pytest.fixture(scope="class")
def one_node() -> Iterator[Cluster]:
    """One node: 3 CPUs, 2 GPUs (declared). Class scope: the many-node tests start their own."""
    yield from running_head(num_cpus=3, num_gpus=2)


@pytest.mark.usefixtures("one_node")
class TestOneNode:
    def test_task_rows_name_the_placement_group_they_ran_in(self) -> None:
        """``util.state.list_tasks`` rows carry Ray's ``placement_group_id``: the group a
        task or an actor's creation was scheduled into, None outside one; filters take it.
        So do ``list_actors`` rows."""
        from lumos.util import state as ray_state
        pg = placement_group([{"CPU": 2}], strategy="PACK")
        assert lumos.get(pg.ready(), timeout=30) == pg
        try:
            strategy = PlacementGroupSchedulingStrategy(pg)

            @lumos.remote
            def in_or_out() -> int:
                return 1

            @lumos.remote
            class Holder:
                def ping(self) -> int:
                    return 1

            holder = Holder.options(scheduling_strategy=strategy).remote()
            refs = [in_or_out.options(scheduling_strategy=strategy).remote(), in_or_out.remote(),
                    holder.ping.remote()]
            assert lumos.get(refs, timeout=60) == [1, 1, 1]
            inside, outside = refs[0].task_id().hex(), refs[1].task_id().hex()

            def rows() -> dict[str, Any]:
                return {r["task_id"]: r for r in ray_state.list_tasks(limit=10_000)}
            wait_for(lambda: {inside, outside} <= set(rows()), 20)
            got = rows()
            assert got[inside]["placement_group_id"] == pg.id.hex()
            assert got[outside]["placement_group_id"] is None
            grouped = ray_state.list_tasks(filters=[("placement_group_id", "=", pg.id.hex())], limit=10_000)
            # (pg.ready() is a task in the group, as in Ray)
            assert sorted((r["type"], r["func_or_class_name"].split(".")[-1]) for r in grouped) == [
                ("ACTOR_CREATION_TASK", "Holder"), ("NORMAL_TASK", "bundle_reservation_check"),
                ("NORMAL_TASK", "in_or_out")], grouped
            # Actor rows too; an actor outside a group has None.
            free = Holder.remote()
            assert lumos.get(free.ping.remote(), timeout=60) == 1
            actors = {r["actor_id"]: r for r in ray_state.list_actors(limit=-1)}
            assert actors[holder._actor_id.hex()]["placement_group_id"] == pg.id.hex()
            assert actors[free._actor_id.hex()]["placement_group_id"] is None
            in_group = ray_state.list_actors(filters=[("placement_group_id", "=", pg.id.hex())], limit=-1)
            assert [r["actor_id"] for r in in_group] == [holder._actor_id.hex()]
            lumos.kill(free)
            lumos.kill(holder)
        finally:
            remove_placement_group(pg)

    def test_ready_resolves_and_removal_frees_the_resources(self) -> None:
        pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="PACK")
        assert lumos.get(pg.ready(), timeout=30) == pg
        assert pg.wait(5) is True
        assert pg.bundle_specs == [{"CPU": 1}, {"CPU": 1}]
        wait_for(lambda: _free("CPU") == 1, 10)  # the bundles' CPUs left the node's pool
        row = placement_group_table(pg)
        assert row["state"] == "CREATED" and len(set(row["bundles_to_node_id"].values())) == 1
        assert row["stats"]["scheduling_state"] == "FINISHED"  # (Ray's name for a created group)
        assert row["bundles_to_gpu_ids"] == {}  # CPU-only bundles
        remove_placement_group(pg)
        wait_for(lambda: _free("CPU") == 3, 10)
        assert placement_group_table(pg)["state"] == "REMOVED"
        assert placement_group_table(pg)["stats"]["scheduling_state"] == "REMOVED"
        with pytest.raises(ValueError, match="removed"):
            pg.wait(1)
        # strategy=None is PACK, as in Ray.
        packed = placement_group([{"CPU": 0.5}], strategy=None)
        assert packed.wait(30) and placement_group_table(packed)["strategy"] == "PACK"
        remove_placement_group(packed)

    def test_the_empty_group_is_no_group(self) -> None:
        # As in Ray: ready() at once, wait() False, and a task "in" it runs in no group.
        empty = PlacementGroup.empty()
        assert empty.is_empty and empty.bundle_specs == []
        assert lumos.get(empty.ready(), timeout=10) == empty
        assert empty.wait(1) is False
        assert lumos.get(current_group.options(scheduling_strategy=_in(empty)).remote(), timeout=30) is None

    def test_child_tasks_and_actors_are_captured_only_when_asked(self) -> None:
        from lumos.util import get_current_placement_group

        @lumos.remote(num_cpus=1)
        def child() -> str | None:
            pg = get_current_placement_group()
            return pg.id.hex() if pg is not None else None

        @lumos.remote
        class Holder:
            def group(self) -> str | None:
                pg = get_current_placement_group()
                return pg.id.hex() if pg is not None else None

            def spawn(self) -> str | None:
                return lumos.get(child.remote(), timeout=60)

        @lumos.remote(num_cpus=1)
        def parent() -> list[str | None]:
            own = get_current_placement_group()
            holder = Holder.remote()
            return [own.id.hex() if own else None, lumos.get(child.remote(), timeout=60),
                    lumos.get(holder.group.remote(), timeout=60), lumos.get(holder.spawn.remote(), timeout=60)]

        pg = placement_group([{"CPU": 1}, {"CPU": 1}])
        assert pg.wait(30)
        try:
            gid = pg.id.hex()
            captured = PlacementGroupSchedulingStrategy(pg, 0, placement_group_capture_child_tasks=True)
            assert lumos.get(parent.options(scheduling_strategy=captured).remote(), timeout=90) == [gid] * 4
            # Without capture the children schedule on their own (outside the group).
            assert lumos.get(parent.options(scheduling_strategy=_in(pg, 0)).remote(), timeout=90) == \
                [gid, None, None, None]
            # An actor placed with capture passes it on to the tasks its methods submit.
            holder = Holder.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, -1, placement_group_capture_child_tasks=True)).remote()
            assert lumos.get([holder.group.remote(), holder.spawn.remote()], timeout=60) == [gid, gid]
            lumos.kill(holder)
        finally:
            remove_placement_group(pg)

    def test_tasks_in_a_bundle_run_from_its_cpus_only(self) -> None:
        pg = placement_group([{"CPU": 1}])
        assert pg.wait(30)
        try:
            runs = lumos.get([where.options(scheduling_strategy=_in(pg, 0)).remote(0.3) for _ in range(3)],
                             timeout=60)
            # One CPU in the bundle: they ran one after another although the node has 2 more free.
            spans = sorted((r[1], r[2]) for r in runs)
            assert all(a[1] <= b[0] + 0.02 for a, b in zip(spans, spans[1:])), spans
            assert _free("CPU") == 2  # the node's own CPUs were not used for them
        finally:
            remove_placement_group(pg)

    def test_gpus_of_a_bundle_are_the_ones_its_tasks_and_actors_see(self) -> None:
        pg = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="STRICT_PACK")
        assert pg.wait(30)
        try:
            seen0 = lumos.get([gpus.options(scheduling_strategy=_in(pg, 0)).remote() for _ in range(3)], timeout=60)
            seen1 = lumos.get([gpus.options(scheduling_strategy=_in(pg, 1)).remote() for _ in range(3)], timeout=60)
            ids0 = {tuple(ids) for ids, _ in seen0}
            ids1 = {tuple(ids) for ids, _ in seen1}
            assert len(ids0) == 1 and len(ids1) == 1 and ids0 != ids1, (seen0, seen1)
            # The GCS knows them too (from the raylet's reservation answer).
            assert placement_group_table(pg)["bundles_to_gpu_ids"] == \
                {0: [int(g) for g in next(iter(ids0))], 1: [int(g) for g in next(iter(ids1))]}
            assert {cuda for _, cuda in seen0} == {str(next(iter(ids0))[0])}
            actor = Probe.options(num_gpus=1, scheduling_strategy=_in(pg, 1)).remote()
            assert tuple(lumos.get(actor.gpus.remote(), timeout=60)) in ids1
            lumos.kill(actor)
        finally:
            remove_placement_group(pg)

    def test_removal_stops_an_actor_in_the_group(self) -> None:
        pg = placement_group([{"CPU": 1}])
        actor = Probe.options(num_cpus=1, scheduling_strategy=_in(pg, 0)).remote()
        lumos.get(actor.node.remote(), timeout=60)
        remove_placement_group(pg)
        with pytest.raises(lumos.exceptions.ActorDiedError):
            for _ in range(50):
                lumos.get(actor.node.remote(), timeout=30)
                time.sleep(0.1)
        wait_for(lambda: _free("CPU") == 3, 10)

    def test_tasks_of_a_removed_group_fail_with_task_placement_group_removed(self) -> None:
        # Running (stopped with the group, then not placeable again) or submitted after: the
        # error is Ray's TaskPlacementGroupRemoved (it was a LumosSystemError, "could not
        # lease a worker: RemoteError: ...").
        from lumos.exceptions import TaskPlacementGroupRemoved

        @lumos.remote(num_cpus=1)
        def long_one() -> int:
            time.sleep(60)
            return 1

        pg = placement_group([{"CPU": 1}])
        assert pg.wait(30)
        # (max_retries=0: it failed as a WorkerCrashedError; retried, it met the removed group)
        running = long_one.options(scheduling_strategy=_in(pg, 0), max_retries=0).remote()
        wait_for(lambda: _free("CPU") == 2 and lumos.wait([running], timeout=0)[1], 10)
        time.sleep(0.5)  # (running by now)
        queued = where.options(scheduling_strategy=_in(pg, 0)).remote(0)  # waits for the bundle's CPU
        time.sleep(0.3)
        remove_placement_group(pg)
        with pytest.raises(TaskPlacementGroupRemoved, match="long_one.*was removed"):
            lumos.get(running, timeout=30)
        with pytest.raises(TaskPlacementGroupRemoved, match="was removed"):
            lumos.get(queued, timeout=30)
        with pytest.raises(TaskPlacementGroupRemoved, match="was removed"):
            lumos.get(where.options(scheduling_strategy=_in(pg, 0)).remote(0), timeout=30)
        wait_for(lambda: _free("CPU") == 3, 10)

    def test_legacy_options_and_any_bundle(self) -> None:
        pg = placement_group([{"CPU": 1}, {"CPU": 1, "GPU": 1}], strategy="STRICT_PACK")
        assert pg.wait(30)
        try:
            ids, _ = lumos.get(gpus.options(placement_group=pg, placement_group_bundle_index=1).remote(), timeout=60)
            assert len(ids) == 1
            # Index -1: any bundle that fits; a GPU task can only fit bundle 1.
            assert lumos.get(gpus.options(scheduling_strategy=_in(pg, -1)).remote(), timeout=60)[0] == ids
            assert lumos.get(current_group.options(scheduling_strategy=_in(pg, 0)).remote(), timeout=60) == pg
            assert lumos.get(current_group.remote(), timeout=60) is None
        finally:
            remove_placement_group(pg)

    def test_request_larger_than_the_bundle_fails_with_a_clear_error(self) -> None:
        pg = placement_group([{"CPU": 1}])
        assert pg.wait(30)
        try:
            # The group's bundles are known here: ValueError at the call, as in Ray.
            with pytest.raises(ValueError, match=r"where asks for \{'CPU': 2.0\}, more than bundle 0 of its "):
                where.options(num_cpus=2, scheduling_strategy=_in(pg, 0)).remote()
            with pytest.raises(ValueError, match="more than any bundle"):
                where.options(num_cpus=2, placement_group=pg).remote()
            with pytest.raises(ValueError, match="placement_group_bundle_index=3 is out of range"):
                where.options(scheduling_strategy=_in(pg, 3)).remote()
            # An actor's creation too (its handle came back; its calls raised ActorUnschedulableError).
            with pytest.raises(ValueError, match=r"actor Probe asks for \{'CPU': 2.0\}"):
                Probe.options(num_cpus=2, scheduling_strategy=_in(pg, 0)).remote()
            with pytest.raises(ValueError, match="out of range"):
                Probe.options(scheduling_strategy=_in(pg, 5)).remote()
            with pytest.raises(ValueError, match="more than any bundle"):
                Probe.options(num_gpus=1, scheduling_strategy=_in(pg, -1)).remote()
            # A handle that does not know them (as one rebuilt from its id): the raylet refuses.
            from lumos.util.placement_group import PlacementGroup
            bare = PlacementGroup(pg.id)
            with pytest.raises(Exception, match="does not fit in bundle 0"):
                lumos.get(where.options(num_cpus=2, scheduling_strategy=_in(bare, 0)).remote(), timeout=60)
            with pytest.raises(Exception, match="out of range"):
                lumos.get(where.options(scheduling_strategy=_in(PlacementGroup(pg.id), 3)).remote(), timeout=60)
        finally:
            remove_placement_group(pg)

    def test_strict_pack_too_big_for_any_node_stays_pending(self) -> None:
        pg = placement_group([{"CPU": 2}, {"CPU": 2}], strategy="STRICT_PACK")
        try:
            assert pg.wait(1.0) is False
            ready, _ = lumos.wait([pg.ready()], timeout=1.0)
            assert ready == []
            assert placement_group_table(pg)["state"] == "PENDING"
            stats = placement_group_table(pg)["stats"]
            assert stats["scheduling_state"] == "INFEASIBLE" and "infeasible" in stats["scheduling_detail"]
            assert placement_group_table(pg)["bundles_to_node_id"] == {0: "", 1: ""}  # (unplaced, as Ray's)
        finally:
            remove_placement_group(pg)

    def test_groups_of_a_finished_job_are_removed_unless_detached(self, one_node: Cluster) -> None:
        script = ("import lumos, sys\n"
                  "lumos.init(address=sys.argv[1], _token=sys.argv[2])\n"
                  "a = lumos.util.placement_group([{'CPU': 1}], name='job-scoped')\n"
                  "b = lumos.util.placement_group([{'CPU': 1}], name='kept', lifetime='detached')\n"
                  "assert a.wait(30) and b.wait(30)\n")
        done = subprocess.run([sys.executable, "-c", script, one_node.address, one_node.token],
                              capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr

        def states() -> dict[str, str]:
            return {row["name"]: row["state"] for row in placement_group_table().values()
                    if row["name"] in ("job-scoped", "kept")}
        wait_for(lambda: states() == {"job-scoped": "REMOVED", "kept": "CREATED"}, 20)
        kept = next(row for row in placement_group_table().values() if row["name"] == "kept")
        remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(kept["placement_group_id"]))))
        wait_for(lambda: _free("CPU") == 3, 10)

    def test_named_group_and_bad_arguments(self) -> None:
        pg = placement_group([{"CPU": 1}], name="trainers")
        try:
            assert lumos.util.get_placement_group("trainers") == pg
            assert pg.id.hex() in placement_group_table()
            with pytest.raises(ValueError, match="already exists"):
                placement_group([{"CPU": 1}], name="trainers")
        finally:
            remove_placement_group(pg)
        with pytest.raises(ValueError, match="no placement group named"):
            lumos.util.get_placement_group("trainers")
        with pytest.raises(ValueError, match="STRICT_SPREAD"):
            placement_group([{"CPU": 1}], strategy="TIGHT")
        with pytest.raises(ValueError, match="empty"):
            placement_group([{"CPU": 0}])
        with pytest.raises(ValueError, match="non-empty list"):
            placement_group([])
        with pytest.raises(TypeError, match="bundle 0"):
            placement_group(["CPU"])  # type: ignore[list-item]


# ----------------------------------------------------------------------------- many nodes


@pytest.fixture
def three_nodes() -> Iterator[tuple[Cluster, list[Any]]]:
    """Head (1 CPU) + two nodes of 2 CPUs; the last one also has 2 GPUs."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        n1 = cluster.add_node(num_cpus=2)
        n2 = cluster.add_node(num_cpus=2, num_gpus=2)
        cluster.connect()
        yield cluster, [cluster.head_node, n1, n2]
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_strategies_across_nodes_with_tasks_and_actors_in_bundles(three_nodes: tuple[Cluster, list[Any]]) -> None:
    cluster, nodes = three_nodes
    ids = [n.node_id for n in nodes]
    # STRICT_SPREAD: a node per bundle; every bundle's tasks run on its node.
    pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
    assert pg.wait(30)
    where_bundles = placement_group_table(pg)["bundles_to_node_id"]
    assert set(where_bundles.values()) == set(ids)
    for i in range(3):
        runs = lumos.get([where.options(scheduling_strategy=_in(pg, i)).remote() for _ in range(2)], timeout=60)
        assert {r[0] for r in runs} == {where_bundles[i]}
    actor = Probe.options(num_cpus=1, scheduling_strategy=_in(pg, 2)).remote()
    assert lumos.get(actor.node.remote(), timeout=60) == where_bundles[2]
    # The bundles show in the resources under Ray's names, each node's (as of its heartbeat).
    g = pg.id.hex()
    total = lumos.cluster_resources()
    assert total[f"CPU_group_{g}"] == 3 and total[f"bundle_group_{g}"] == 3000
    assert [total[f"CPU_group_{i}_{g}"] for i in range(3)] == [1, 1, 1] and total["CPU"] == 5
    wait_for(lambda: f"CPU_group_2_{g}" not in lumos.available_resources(), 10)  # the actor holds it
    free = lumos.available_resources()
    assert free[f"CPU_group_{g}"] == 2 and free[f"CPU_group_0_{g}"] == free[f"CPU_group_1_{g}"] == 1
    remove_placement_group(pg)
    wait_for(lambda: _free("CPU") == 5, 10)
    wait_for(lambda: not [k for k in lumos.cluster_resources() if "_group_" in k], 10)

    # STRICT_PACK: all on one node (only the 2-CPU nodes can hold 2 CPUs).
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="STRICT_PACK")
    assert pg.wait(30)
    placed = set(placement_group_table(pg)["bundles_to_node_id"].values())
    assert len(placed) == 1 and placed <= {ids[1], ids[2]}
    remove_placement_group(pg)

    # PACK that no node can hold alone: as few nodes as possible (2 + 2 + 1 CPUs: all three).
    pg = placement_group([{"CPU": 2}, {"CPU": 2}, {"CPU": 1}], strategy="PACK")
    assert pg.wait(30)
    assert set(placement_group_table(pg)["bundles_to_node_id"].values()) == set(ids)
    remove_placement_group(pg)

    # SPREAD: two bundles on two different nodes.
    pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
    assert pg.wait(30)
    assert len(set(placement_group_table(pg)["bundles_to_node_id"].values())) == 2
    remove_placement_group(pg)

    # GPUs: bundles on the GPU node; each bundle's tasks see that bundle's GPU.
    pg = placement_group([{"GPU": 1}, {"GPU": 1}], strategy="PACK")
    assert pg.wait(30)
    assert set(placement_group_table(pg)["bundles_to_node_id"].values()) == {ids[2]}
    g0 = {tuple(lumos.get(gpus.options(scheduling_strategy=_in(pg, 0)).remote(), timeout=60)[0]) for _ in range(2)}
    g1 = {tuple(lumos.get(gpus.options(scheduling_strategy=_in(pg, 1)).remote(), timeout=60)[0]) for _ in range(2)}
    assert len(g0) == 1 and len(g1) == 1 and g0 != g1
    remove_placement_group(pg)
    wait_for(lambda: _free("CPU") == 5 and _free("GPU") == 2, 10)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_infeasible_strict_spread_stays_pending_until_a_node_joins() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        cluster.add_node(num_cpus=1)
        cluster.connect()
        pg = placement_group([{"CPU": 1}] * 3, strategy="STRICT_SPREAD")
        ready_ref = pg.ready()
        ready, _ = lumos.wait([ready_ref], timeout=2.0)
        assert ready == [] and placement_group_table(pg)["state"] == "PENDING"
        third = cluster.add_node(num_cpus=1)
        assert lumos.get(ready_ref, timeout=60) == pg
        assert third.node_id in placement_group_table(pg)["bundles_to_node_id"].values()
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_bundles_of_a_dead_node_are_placed_again_and_its_actor_restarts_there() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        doomed = cluster.add_node(num_cpus=1, num_gpus=1, resources={"spot": 1})
        spare = cluster.add_node(num_cpus=1, num_gpus=1, resources={"spot": 1})
        cluster.connect()
        pg = placement_group([{"CPU": 1, "spot": 1, "GPU": 1}], strategy="PACK")
        assert pg.wait(30)
        first = placement_group_table(pg)["bundles_to_node_id"][0]
        assert placement_group_table(pg)["bundles_to_gpu_ids"] == {0: [0]}
        victim = doomed if first == doomed.node_id else spare
        survivor = spare if victim is doomed else doomed
        actor = Probe.options(num_cpus=1, max_restarts=1, scheduling_strategy=_in(pg, 0)).remote()
        assert lumos.get(actor.node.remote(), timeout=60) == victim.node_id
        cluster.remove_node(victim)
        wait_for(lambda: placement_group_table(pg)["bundles_to_node_id"].get(0) == survivor.node_id
                 and placement_group_table(pg)["state"] == "CREATED", 30)
        assert placement_group_table(pg)["bundles_to_gpu_ids"] == {0: [0]}  # the survivor's reservation
        node = wait_for(lambda: _try_node(actor), 60)
        assert node == survivor.node_id
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def _try_node(actor: Any) -> str | None:
    try:
        return lumos.get(actor.node.remote(), timeout=10)  # type: ignore[no-any-return]
    except lumos.exceptions.LumosError:
        return None


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pending_groups_get_freed_room_in_the_order_they_were_created() -> None:
    """Three groups wait, a third of a second apart, for the one "slot" unit a first group
    holds; as each holder is removed the unit goes to the oldest waiting group. (Each
    pending group looked again on its own timer, and the first to look after the room
    freed took it, whatever its age.)"""
    with contextlib.contextmanager(running_head)(num_cpus=1, resources={"slot": 1}):
        first = placement_group([{"slot": 1}])
        assert first.wait(30)
        waiting = []
        for _ in range(3):
            time.sleep(0.35)
            waiting.append(placement_group([{"slot": 1}]))
        time.sleep(0.5)
        holders = [first, *waiting]
        for i, pg in enumerate(waiting):
            remove_placement_group(holders[i])
            assert pg.wait(30), i
            assert [placement_group_table(p)["state"] for p in waiting[i + 1:]] == ["PENDING"] * (2 - i), i
        remove_placement_group(waiting[-1])
