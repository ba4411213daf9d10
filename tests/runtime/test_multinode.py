"""Bottom-up scheduling across real raylet processes (``lumos.testing.Cluster``).

The local raylet grants while the request fits; otherwise the GCS global scheduler
picks a node and the owner follows the spillback. Plus the pure
``GlobalSchedulerState`` fed with node views.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterator

import pytest

import lumos
from lumos._private.gcs.global_scheduler import GlobalSchedulerState, NodeView, Unschedulable
from lumos._private.ids import NodeID, WorkerID
from lumos._private.protocol import messages as m
from lumos._private.raylet.resources import to_units
from lumos.testing import Cluster
from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tests.conftest import running_two_nodes, wait_for


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple[Cluster, Any]]:
    """Head: 1 CPU. Second node: 2 CPUs and the only ``special`` resource."""
    yield from running_two_nodes(1, num_cpus=2, resources={"special": 1})


@lumos.remote
def where(sleep_s: float = 0.0) -> tuple[str, float, float]:
    start = time.time()
    time.sleep(sleep_s)
    return lumos.get_runtime_context().get_node_id(), start, time.time()


def test_custom_resource_only_one_node_has_runs_there(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_nodes
    runs = lumos.get([where.options(resources={"special": 1}).remote() for _ in range(3)], timeout=30)
    assert {r[0] for r in runs} == {node.node_id}


def test_tasks_spill_to_another_node_when_the_local_one_is_full(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_nodes
    runs = lumos.get([where.remote(2.0) for _ in range(3)], timeout=60)
    nodes = [r[0] for r in runs]
    assert node.node_id in nodes, nodes
    # The head has one CPU: a task on the second node overlapped one on the head.
    head_runs = [r for r in runs if r[0] != node.node_id]
    other_runs = [r for r in runs if r[0] == node.node_id]
    assert any(a[1] < b[2] and b[1] < a[2] for a in head_runs for b in other_runs), runs


def test_spread_uses_every_node(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_nodes
    runs = lumos.get([where.options(scheduling_strategy="SPREAD").remote(1.5) for _ in range(4)], timeout=60)
    assert {r[0] for r in runs} == {cluster.head_node.node_id, node.node_id}  # type: ignore[union-attr]


def test_node_affinity_hard_and_soft(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_nodes
    hard = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    runs = lumos.get([where.options(scheduling_strategy=hard).remote() for _ in range(4)], timeout=30)
    assert {r[0] for r in runs} == {node.node_id}
    head = cluster.head_node.node_id  # type: ignore[union-attr]
    runs = lumos.get([where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False)).remote()
                      for _ in range(2)], timeout=30)
    assert {r[0] for r in runs} == {head}
    gone = "ab" * 16
    soft = NodeAffinitySchedulingStrategy(gone, soft=True)
    assert lumos.get(where.options(scheduling_strategy=soft).remote(), timeout=30)[0] in (head, node.node_id)
    bad = where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(gone, soft=False)).remote()
    with pytest.raises(lumos.exceptions.TaskUnschedulableError, match="is not alive"):  # as in Ray
        lumos.get(bad, timeout=30)


def test_infeasible_task_runs_when_a_node_that_fits_joins(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, _ = two_nodes
    ref = where.options(resources={"late": 1}).remote()
    ready, _ = lumos.wait([ref], timeout=1.0)
    assert ready == []
    assert lumos.get(where.remote(), timeout=30)  # other work is not blocked meanwhile
    late = cluster.add_node(num_cpus=1, resources={"late": 1})
    try:
        assert lumos.get(ref, timeout=30)[0] == late.node_id
    finally:
        cluster.remove_node(late)


def test_heartbeats_carry_available_resources(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_nodes

    @lumos.remote(resources={"special": 1})
    def hold(s: float) -> None:
        time.sleep(s)

    ref = hold.remote(2.0)
    wait_for(lambda: lumos.available_resources().get("special", 0) == 0, 10)
    lumos.get(ref, timeout=30)
    wait_for(lambda: lumos.available_resources().get("special", 0) == 1, 10)


# ----------------------------------------------------------------------------- pure state


def view(name: bytes, total: dict[str, float], avail: dict[str, float] | None = None, queue: int = 0) -> NodeView:
    units = {k: to_units(v) for k, v in total.items()}
    return NodeView(name, m.Address(name, b"", "", "127.0.0.1", 1), units,
                    {k: to_units(v) for k, v in (avail if avail is not None else total).items()}, queue)


def req(resources: dict[str, float], strategy: Any = None, from_node: bytes = b"a",
        args: dict[bytes, int] | None = None) -> m.ScheduleLease:
    return m.ScheduleLease(b"job", resources, strategy, "f", from_node, args)


def test_global_scheduler_prefers_free_nodes_then_argument_locality() -> None:
    s = GlobalSchedulerState(heartbeat_interval_s=0.2)
    busy, idle = view(b"a", {"CPU": 1}, {"CPU": 0}, queue=3), view(b"b", {"CPU": 1})
    assert s.pick([busy, idle], req({"CPU": 1}), now=0.0) == b"b"
    # b now holds a recent placement: the next goes where the wait is shortest.
    c = view(b"c", {"CPU": 4})
    assert s.pick([busy, idle, c], req({"CPU": 1}), now=0.0) == b"c"
    big = {b"b": 50 * 1024 * 1024}
    assert s.pick([view(b"a", {"CPU": 1}), view(b"b", {"CPU": 1})], req({"CPU": 1}, args=big), now=10.0) == b"b"


def test_global_scheduler_infeasible_spread_and_affinity() -> None:
    s = GlobalSchedulerState(heartbeat_interval_s=0.2)
    nodes = [view(b"a", {"CPU": 2}), view(b"b", {"CPU": 2, "GPU": 1})]
    assert s.pick(nodes, req({"TPU": 1}), now=0.0) is None
    assert s.pick(nodes, req({"GPU": 1}), now=0.0) == b"b"
    picks = [s.pick(nodes, req({"CPU": 1}, ["SPREAD"]), now=1.0) for _ in range(4)]
    assert sorted(picks) == [b"a", b"a", b"b", b"b"]  # type: ignore[type-var]
    assert s.pick(nodes, req({"CPU": 1}, ["NODE", b"a", False], from_node=b"b"), now=2.0) == b"a"
    with pytest.raises(Unschedulable, match="not alive"):
        s.pick(nodes, req({"CPU": 1}, ["NODE", b"zz", False]), now=2.0)
    with pytest.raises(Unschedulable, match="less than"):
        s.pick(nodes, req({"GPU": 1}, ["NODE", b"a", False]), now=2.0)
    assert s.pick(nodes, req({"CPU": 1}, ["NODE", b"zz", True]), now=2.0) in (b"a", b"b")


def test_a_dead_node_leaves_the_global_schedulers_tables(tmp_path: Any) -> None:
    """The GCS marking a node dead drops its recent placements and spread count."""
    from lumos._private.config import Config
    from lumos._private.gcs.server import GcsServer
    from lumos._private.gcs.storage.memory import InMemoryStorage
    from lumos._private.protocol.gcs_messages import NodeInfo

    async def scenario() -> None:
        gcs = GcsServer(Config(), b"token", InMemoryStorage(), str(tmp_path))
        node_id = NodeID(b"n" * 28)
        gcs.nodes[node_id] = NodeInfo(node_id, m.Address(node_id, WorkerID(b""), "", "127.0.0.1", 1), "host", 1, {"CPU": 1.0}, "ALIVE",
                                      0.0, "", 0, str(tmp_path), False, {}, [])
        state = gcs.global_scheduler.state
        assert state.pick(gcs.global_scheduler.node_views(), req({"CPU": 1}, ["SPREAD"]), now=0.0) == node_id
        assert node_id in state.recent and node_id in state.spread_count
        gcs.mark_node_dead(node_id, "test")
        assert node_id not in state.recent and node_id not in state.spread_count

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- object transfer


def head_transfer_stats() -> dict[str, int]:
    from lumos._private import worker_context
    assert worker_context.core_worker is not None
    return worker_context.core_worker.call_raylet(m.GetNodeStats())["transfer"]  # type: ignore[no-any-return]


def test_large_result_made_on_another_node_is_pulled_and_read_only(two_nodes: tuple[Cluster, Any]) -> None:
    import numpy as np

    @lumos.remote(resources={"special": 1})
    def make(n: int) -> Any:
        return np.arange(n, dtype=np.int64)

    before = head_transfer_stats()
    ref = make.remote(5_000_000)  # 40 MB, stored on the second node
    value = lumos.get(ref, timeout=60)
    assert value[-1] == 4_999_999 and not value.flags.writeable
    again = lumos.get(ref, timeout=60)
    assert np.shares_memory(value, again)  # the local copy is read zero-copy
    after = head_transfer_stats()
    assert after["pulls"] == before["pulls"] + 1
    assert after["bytes_pulled"] - before["bytes_pulled"] >= 40_000_000


def test_many_tasks_waiting_for_one_remote_object_cause_one_pull(two_nodes: tuple[Cluster, Any]) -> None:
    import numpy as np
    cluster, node = two_nodes
    head = cluster.head_node.node_id  # type: ignore[union-attr]

    @lumos.remote(resources={"special": 1})
    def make() -> Any:
        return np.ones(3_000_000)

    @lumos.remote(scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
    def total(a: Any) -> tuple[float, str]:
        return float(a.sum()), lumos.get_runtime_context().get_node_id()

    ref = make.remote()
    lumos.wait([ref], timeout=60, fetch_local=False)  # (the tasks pull it)
    before = head_transfer_stats()
    results = lumos.get([total.remote(ref) for _ in range(4)], timeout=60)
    assert results == [(3_000_000.0, head)] * 4
    after = head_transfer_stats()
    assert after["pulls"] == before["pulls"] + 1, (before, after)


def test_freed_object_leaves_no_copy_on_either_node(two_nodes: tuple[Cluster, Any]) -> None:
    import numpy as np
    cluster, node = two_nodes

    @lumos.remote(resources={"special": 1})
    def make() -> Any:
        return np.ones(4_000_000)

    def used() -> dict[str, int]:
        from lumos._private import worker_context
        rows = worker_context.core_worker.call_gcs(m.GetClusterStatus())  # type: ignore[union-attr]
        return {r.node_id.hex(): r.store_used_bytes for r in rows}

    ref = make.remote()
    value = lumos.get(ref, timeout=60)
    assert float(value.sum()) == 4_000_000.0
    wait_for(lambda: all(v >= 32_000_000 for v in used().values()), 10)
    del value, ref
    wait_for(lambda: all(v < 1_000_000 for v in used().values()), 15)


def test_a_flood_of_silent_data_channel_peers_costs_bounded_threads(two_nodes: tuple[Cluster, Any]) -> None:
    import socket

    import numpy as np
    import psutil

    from lumos._private.raylet.object_manager import MAX_DATA_CONNECTIONS
    cluster, node = two_nodes
    raylet = psutil.Process(node.raylet_pid)
    ports = [c.laddr.port for c in raylet.net_connections(kind="inet")
             if c.status == psutil.CONN_LISTEN and c.laddr.port != node.node_manager_port]
    assert len(ports) == 1, ports
    baseline = raylet.num_threads()
    peers = []
    try:
        for _ in range(MAX_DATA_CONNECTIONS * 2):
            peers.append(socket.create_connection((node.node_manager_address, ports[0]), timeout=5))
        time.sleep(0.5)
        assert raylet.num_threads() <= baseline + MAX_DATA_CONNECTIONS + 2, (baseline, raylet.num_threads())
    finally:
        for s in peers:
            s.close()

    @lumos.remote(resources={"special": 1})
    def make() -> Any:
        return np.ones(2_000_000)

    # Transfers still work once the silent peers are dropped (each after the handshake deadline).
    assert float(lumos.get(make.remote(), timeout=60).sum()) == 2_000_000.0
    assert raylet.is_running()

