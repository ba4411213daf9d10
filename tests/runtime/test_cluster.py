"""``lumos.testing.Cluster``: many real raylet processes on one machine.

Also checks node health: a raylet that stops heartbeating (SIGSTOP keeps its socket
open) is declared dead after ``node_death_timeout_ms`` and published on ``nodes``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Callable, Iterator

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for


@pytest.fixture
def make_cluster() -> Iterator[Callable[..., Cluster]]:
    made: list[Cluster] = []

    def make(**head_args: Any) -> Cluster:
        head_args.setdefault("num_cpus", 1)
        head_args.setdefault("_system_config", dict(TEST_CONFIG))
        c = Cluster(initialize_head=True, head_node_args=head_args)
        made.append(c)
        return c

    try:
        yield make
    finally:
        for c in made:
            c.shutdown()
        for c in made:
            check_no_leaks(c.session_dir)


def alive_nodes() -> dict[str, dict[str, Any]]:
    return {n["NodeID"]: n for n in lumos.nodes() if n["Alive"]}


def test_cluster_nodes_have_their_own_resources_and_stores(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(num_cpus=1, resources={"head_res": 1})
    a = cluster.add_node(num_cpus=2, resources={"a_res": 3})
    b = cluster.add_node(num_cpus=1, num_gpus=1, object_store_memory=64 * 1024 * 1024)
    cluster.connect()
    nodes = alive_nodes()
    assert set(nodes) == {cluster.head_node.node_id, a.node_id, b.node_id}  # type: ignore[union-attr]
    assert nodes[a.node_id]["Resources"]["CPU"] == 2 and nodes[a.node_id]["Resources"]["a_res"] == 3
    assert nodes[b.node_id]["Resources"]["GPU"] == 1
    assert nodes[cluster.head_node.node_id]["IsHead"]  # type: ignore[union-attr]
    res = lumos.cluster_resources()
    assert res["CPU"] == 4 and res["GPU"] == 1 and res["head_res"] == 1 and res["a_res"] == 3
    stores = {n.object_store_dir for n in cluster.list_all_nodes()}
    assert len(stores) == 3 and all(os.path.isdir(s) for s in stores)

    @lumos.remote
    def ping() -> str:
        return lumos.get_runtime_context().get_node_id()

    assert lumos.get(ping.remote(), timeout=30) == cluster.head_node.node_id  # type: ignore[union-attr]
    assert "127.0.0.1:" in cluster.address


def test_remove_node_kills_raylet_and_workers_and_gcs_marks_it_dead(
        make_cluster: Callable[..., Cluster]) -> None:
    import psutil
    cluster = make_cluster()
    node = cluster.add_node(num_cpus=2)
    cluster.connect()
    raylet = psutil.Process(node.raylet_pid)
    workers = wait_for(lambda: raylet.children() if len(raylet.children()) >= 2 else None, 10)
    cluster.remove_node(node)
    assert not raylet.is_running() or raylet.status() == psutil.STATUS_ZOMBIE
    wait_for(lambda: not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers), 10)
    assert not os.path.exists(node.object_store_dir)
    dead = wait_for(lambda: [n for n in lumos.nodes() if n["NodeID"] == node.node_id and not n["Alive"]], 10)
    assert "disconnected" in dead[0]["DeathReason"]
    assert lumos.cluster_resources()["CPU"] == 1
    assert cluster.worker_nodes == []


def test_missed_heartbeats_mark_node_dead_and_publish_it(make_cluster: Callable[..., Cluster]) -> None:
    """SIGSTOP keeps the raylet's connections open: only the heartbeat timeout can notice."""
    from lumos._private.config import Config
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import connect, parse_address

    cluster = make_cluster()
    node = cluster.add_node(num_cpus=1)
    config = Config.resolve(TEST_CONFIG)
    timeout_s = config.node_death_timeout_ms / 1000

    async def watch() -> tuple[m.NodeInfo, float]:
        published: asyncio.Queue[m.Publish] = asyncio.Queue()
        conn = await connect(parse_address(cluster.address), token=cluster.token.encode(), config=config,
                             handlers={m.Publish: lambda c, msg: published.put_nowait(msg)})
        try:
            conn.notify(m.Subscribe("nodes", None))
            await conn.call(m.GetAllNodes(), 5)  # the subscription is in place after this reply
            os.kill(node.raylet_pid, signal.SIGSTOP)
            stopped = time.monotonic()
            async with asyncio.timeout(timeout_s + 10):
                while True:
                    msg = await published.get()
                    if msg.data.node_id.hex() == node.node_id and msg.data.state == "DEAD":
                        return msg.data, time.monotonic() - stopped
        finally:
            conn.close()

    try:
        info, took = asyncio.run(watch())
    finally:
        os.kill(node.raylet_pid, signal.SIGCONT)
    assert "no heartbeat" in info.death_reason
    assert timeout_s * 0.8 <= took <= timeout_s + 5, took
    cluster.remove_node(node)


def test_cluster_arguments_are_checked(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster()
    with pytest.raises(TypeError, match="unexpected arguments"):
        cluster.add_node(num_cpu=1)
    with pytest.raises(ValueError, match="whole cluster"):
        cluster.add_node(_system_config={"validate": True})
    with pytest.raises(ValueError, match="initialize_head"):
        Cluster(connect=True)
    cluster.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        cluster.add_node()
