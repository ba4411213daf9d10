"""A lease request the GCS sent to a busy node moves when another node frees up.

When no node has room, the GCS places a request where the wait looks shortest, and it
queues there. Work holding that node (an actor, a long task) can outlast the guess: the
request, still waiting after a while, asks the GCS again and moves to a node that has
room now (as Ray's raylet spills its waiting tasks); an actor's creation alike. Requests
pinned to their node (node affinity, a placement group bundle) stay.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import lumos
from lumos._private.gcs.global_scheduler import GlobalSchedulerState
from lumos._private.protocol import messages as m
from lumos.testing import Cluster
from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for
from tests.runtime.test_multinode import view

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def two_workers() -> Iterator[tuple[str, str]]:
    """A head without CPUs (the driver's node) and two nodes of one CPU each."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "_system_config": dict(TEST_CONFIG)})
    try:
        a = cluster.add_node(num_cpus=1)
        b = cluster.add_node(num_cpus=1)
        cluster.connect()
        yield a.node_id, b.node_id
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@lumos.remote(num_cpus=1)
class Holder:
    def ready(self) -> bool:
        return True


@lumos.remote(num_cpus=1)
def where() -> str:
    return lumos.get_runtime_context().get_node_id()


def _hold(node_id: str) -> Any:
    h = Holder.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    assert lumos.get(h.ready.remote(), timeout=60)
    return h


def _queued_at(nodes: tuple[str, str]) -> str | None:
    rows = {r["node_id"]: r for r in lumos.state.list_nodes()}
    waiting = [n for n in nodes if rows[n]["pending_leases"] > 0]
    return waiting[0] if len(waiting) == 1 else None


def test_a_request_waiting_behind_a_holder_moves_to_the_node_that_frees(two_workers: tuple[str, str]) -> None:
    holders = {n: _hold(n) for n in two_workers}
    try:
        ref = where.remote()  # no room anywhere: the GCS sends it to one node, where it queues
        queued: list[str] = []
        wait_for(lambda: bool(queued.append(_queued_at(two_workers)) or queued[-1]), 30, 0.05)
        other = next(n for n in two_workers if n != queued[-1])
        lumos.kill(holders.pop(other))
        # Without the move it would wait for the other holder, which never ends.
        assert lumos.get(ref, timeout=30) == other
    finally:
        for h in holders.values():
            lumos.kill(h)


def test_an_actor_waiting_for_a_busy_node_is_created_on_the_node_that_frees(two_workers: tuple[str, str]) -> None:
    holders = {n: _hold(n) for n in two_workers}
    actor = None
    try:
        actor = Holder.remote()  # the GCS places its creation on one node, where it waits
        queued: list[str] = []
        wait_for(lambda: bool(queued.append(_queued_at(two_workers)) or queued[-1]), 30, 0.05)
        other = next(n for n in two_workers if n != queued[-1])
        lumos.kill(holders.pop(other))
        assert lumos.get(actor.ready.remote(), timeout=30)
        (row,) = lumos.util.state.list_actors(filters=[("actor_id", "=", actor._actor_id.hex())])
        assert row["node_id"] == other
    finally:
        for h in [*holders.values(), actor]:
            if h is not None:
                lumos.kill(h)


def test_a_request_pinned_to_its_node_stays(two_workers: tuple[str, str]) -> None:
    a, b = two_workers
    holders = {n: _hold(n) for n in two_workers}
    try:
        ref = where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(a, soft=False)).remote()
        wait_for(lambda: _queued_at(two_workers) == a, 30, 0.05)
        lumos.kill(holders.pop(b))
        ready, _ = lumos.wait([ref], timeout=2.0)
        assert ready == []  # b has room, but the request may only run on a
        lumos.kill(holders.pop(a))
        assert lumos.get(ref, timeout=30) == a
    finally:
        for h in holders.values():
            lumos.kill(h)


@lumos.remote
class Plain:
    """An actor that asks for no resources."""

    def node(self) -> str:
        return lumos.get_runtime_context().get_node_id()


def test_an_actor_that_asks_for_no_resources_is_placed_only_on_a_node_with_cpus(two_workers: tuple[str, str]) -> None:
    # As in Ray: 1 CPU to be placed, none held; a head started with num_cpus=0 gets none.
    head = lumos.get_runtime_context().get_node_id()
    assert head not in two_workers
    actors = [Plain.remote() for _ in range(4)]
    assert set(lumos.get([a.node.remote() for a in actors], timeout=60)) <= set(two_workers)
    wait_for(lambda: lumos.available_resources().get("CPU") == 2.0, 10, 0.1)  # none held
    on_head = Plain.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    assert lumos.get(on_head.node.remote(), timeout=60) == head
    never = Plain.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
    with pytest.raises(lumos.exceptions.ActorUnschedulableError, match="needs 1 CPU on its node to be placed"):
        lumos.get(never.node.remote(), timeout=60)
    for a in actors + [on_head]:
        lumos.kill(a)


def test_the_gcs_names_another_node_only_if_it_has_room() -> None:
    s = GlobalSchedulerState(heartbeat_interval_s=0.2)

    def ask(nodes: list[Any]) -> bytes | None:
        return s.pick(nodes, m.ScheduleLease(b"job", {"CPU": 1}, None, "f", b"a", None, None, {"CPU": 0}, 1,
                                             True), now=0.0)
    # Every node busy: the request stays where it waits (even where another's queue is shorter).
    assert ask([view(b"a", {"CPU": 1}, {"CPU": 0}, queue=3), view(b"b", {"CPU": 1}, {"CPU": 0})]) == b"a"
    # One with room: there.
    assert ask([view(b"a", {"CPU": 1}, {"CPU": 0}, queue=3), view(b"b", {"CPU": 1}, {"CPU": 0}),
                view(b"c", {"CPU": 2}, {"CPU": 1})]) == b"c"
