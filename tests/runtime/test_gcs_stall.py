"""A GCS that stood still (SIGSTOP, swapped out, starved of CPU) does not declare the
nodes dead whose heartbeats it could not read meanwhile."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any, Iterator

import pytest

import lumos
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG, check_no_leaks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CONFIG = {**TEST_CONFIG, "heartbeat_interval_ms": 100, "node_death_timeout_ms": 1500}


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": CONFIG})
    try:
        c.add_node(num_cpus=1, resources={"side": 1})
        yield c
    finally:
        c.shutdown()
        check_no_leaks(c.session_dir)


@lumos.remote(num_cpus=0)
def where() -> str:
    return lumos.get_runtime_context().get_node_id()


def test_a_gcs_stopped_longer_than_the_death_timeout_keeps_its_nodes(cluster: Cluster) -> None:
    cluster.connect()
    before = {n["node_id"] for n in lumos.state.list_nodes(timeout=30) if n["state"] == "ALIVE"}
    assert len(before) == 2
    proc = cluster._head_processes().gcs_proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        time.sleep(4.5)  # three death timeouts without reading a heartbeat
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    time.sleep(2.0)  # more than one death timeout after it resumed: a wrong verdict would show
    nodes = lumos.state.list_nodes(timeout=30)
    assert {n["node_id"]: n["state"] for n in nodes} == {n: "ALIVE" for n in before}
    side = where.options(resources={"side": 1}).remote()
    assert lumos.get(side, timeout=30) in before


def test_the_health_check_excuses_the_time_the_gcs_itself_stood_still(tmp_path: Any) -> None:
    """Socket-free: the GCS's loop is held up for three death timeouts (as by SIGSTOP or CPU
    starvation), so no heartbeat could be read meanwhile; the node stays ALIVE when the loop
    runs again, and is still declared dead once it really falls silent."""
    from lumos._private.config import Config
    from lumos._private.gcs.server import GcsServer
    from lumos._private.gcs.storage.memory import InMemoryStorage
    from lumos._private.ids import NodeID, WorkerID
    from lumos._private.protocol import messages as m

    async def scenario() -> None:
        config = Config(heartbeat_interval_ms=50, node_death_timeout_ms=300)
        gcs = GcsServer(config, b"token", InMemoryStorage(), str(tmp_path))
        node_id = NodeID(b"n" * 28)
        gcs.nodes[node_id] = m.NodeInfo(node_id, m.Address(node_id, WorkerID(b""), "", "127.0.0.1", 1), "host", 1,
                                        {"CPU": 1.0}, "ALIVE", 0.0, "", 0, str(tmp_path), False, {}, [])
        gcs._last_heartbeat[node_id] = time.monotonic()
        health = asyncio.ensure_future(gcs._health_loop())
        try:
            await asyncio.sleep(0.1)
            time.sleep(1.0)  # the loop stands still: nothing is read, nothing is checked
            await asyncio.sleep(0.15)
            assert gcs.nodes[node_id].state == "ALIVE"
            await asyncio.sleep(0.6)  # now the node really is silent for two death timeouts
            assert gcs.nodes[node_id].state == "DEAD"
        finally:
            health.cancel()

    asyncio.run(scenario())
