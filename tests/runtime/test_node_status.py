"""Each node's real memory use and log tails, read through the GCS (issue 13, item 9).

The raylets report their machine's memory and their processes' RSS in their heartbeats;
``list_nodes()`` serves the latest figures. ``get_log`` asks the GCS, which forwards the
request to the named node's raylet; the raylet reads its own files, by ids only.
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import psutil
import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import running_two_nodes, wait_for


@pytest.fixture
def two_nodes() -> Iterator[tuple[Cluster, Any]]:
    yield from running_two_nodes(1, num_cpus=1, resources={"other": 1})


@lumos.remote(resources={"other": 1})
def shout(text: str) -> tuple[str, str]:
    print(text, flush=True)
    ctx = lumos.get_runtime_context()
    return ctx.get_node_id(), ctx.get_worker_id()


@pytest.mark.timeout(90)
def test_node_rows_carry_memory_and_logs_come_from_each_nodes_raylet(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, other = two_nodes
    node_id, worker_id = lumos.get(shout.remote("hello from the other node"), timeout=30)
    assert node_id == other.node_id

    def reported() -> list[dict[str, Any]] | None:
        rows = [r for r in lumos.state.list_nodes() if r["state"] == "ALIVE"]
        return rows if len(rows) == 2 and all(r["memory_total_bytes"] for r in rows) else None
    rows = wait_for(reported, 15)
    total = psutil.virtual_memory().total
    for r in rows:
        assert r["memory_total_bytes"] == total  # both nodes run on this machine
        assert 0 < r["memory_used_bytes"] < total
        assert r["memory_used_bytes"] + r["memory_available_bytes"] == total
        assert 0 < r["lumos_rss_bytes"] < total  # at least the raylet itself
    # The other node's worker printed a line: its output file's tail, through GCS -> raylet.
    text = wait_for(lambda: (t := lumos.state.get_log(other.node_id, worker_id, tail=50))
                    and "hello from the other node" in t and t, 15)
    assert len(text.splitlines()) <= 50
    # Ray's get_log, naming the worker by its pid.
    from lumos.util import state as ray_state
    (pid,) = [w["pid"] for w in lumos.state.list_workers() if w["worker_id"] == worker_id]
    assert "hello from the other node" in "".join(ray_state.get_log(node_id=other.node_id, pid=pid, tail=-1))
    raylet = lumos.state.get_log(other.node_id, None, tail=200, suffix="log")
    assert f"raylet {other.node_id[:8]}" in raylet or other.node_id[:8] in raylet
    assert len(raylet.splitlines()) <= 200


@pytest.mark.timeout(60)
def test_get_log_refuses_bad_ids_paths_and_unknown_nodes(two_nodes: tuple[Cluster, Any]) -> None:
    cluster, other = two_nodes
    for bad in ("../../etc/passwd", "ab", other.node_id + "00"):
        with pytest.raises(ValueError, match="node_id must be a 32-character hex id"):
            lumos.state.get_log(bad)
    with pytest.raises(ValueError, match="worker_id must be"):
        lumos.state.get_log(other.node_id, "../raylet")
    with pytest.raises(ValueError, match="tail must be"):
        lumos.state.get_log(other.node_id, tail=201)
    with pytest.raises(ValueError, match="suffix must be one of log, out"):
        lumos.state.get_log(other.node_id, suffix="../x")
    with pytest.raises(LookupError, match="no alive node"):
        lumos.state.get_log("ab" * 16)
    with pytest.raises(LookupError, match="has no log file worker-"):
        lumos.state.get_log(other.node_id, "cd" * 16)
    # A log name that is a symlink (to a file outside logs/) is not followed.
    link = os.path.join(cluster.session_dir, "logs", f"worker-{'ef' * 6}.out")
    os.symlink(os.path.join(cluster.session_dir, "token"), link)
    with pytest.raises(PermissionError, match=f"cannot read worker-{'ef' * 6}.out"):
        lumos.state.get_log(other.node_id, "ef" * 16)


@pytest.mark.timeout(90)
def test_dashboard_source_gets_the_other_nodes_usage_and_log_over_tcp(two_nodes: tuple[Cluster, Any]) -> None:
    """What the status page shows, through a TCP client (as a dashboard on another machine)."""
    import asyncio
    import time

    from lumos.dashboard import host
    from lumos.dashboard.source import ClusterSource
    from lumos.state import StateClient

    cluster, other = two_nodes
    node_id, worker_id = lumos.get(shout.remote("<b>seen by the dashboard</b>"), timeout=30)
    assert node_id == other.node_id

    async def watch() -> tuple[Any, Any]:
        src = ClusterSource(StateClient(cluster.gcs_address, cluster.token))
        key = (other.node_id, worker_id, "out", 40)
        try:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                src.request_log(*key)  # starts the source's poll loop
                await asyncio.sleep(0.2)
                usage = host.reported_usage(src.status.get(other.node_id))
                tail = src.logs.get(key)
                if usage is not None and tail is not None and "seen by the dashboard" in tail.text:
                    return usage, tail
            raise AssertionError(f"no usage or log tail in 30s: {src.status.get(other.node_id)}, "
                                 f"{src.logs.get(key)}, {src.error}")
        finally:
            src.close()
    usage, tail = asyncio.run(watch())
    assert 0 < usage.memory_used_bytes < usage.memory_total_bytes == psutil.virtual_memory().total
    assert usage.lumos_rss_bytes > 0
    assert tail.name == f"worker-{worker_id[:12]}.out" and not tail.error
