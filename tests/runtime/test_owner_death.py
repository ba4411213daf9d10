"""Store memory follows ownership: when an owner exits or dies, its objects are freed on
every node (primaries and pulled copies), and a gone driver is no longer listed ALIVE."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any, Iterator

import psutil
import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for

MIB = 1024 * 1024

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 256 * MIB, "_system_config": dict(TEST_CONFIG)})
    try:
        cluster.add_node(num_cpus=1, resources={"far": 1}, object_store_memory=256 * MIB)
        cluster.connect()
        yield cluster
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def _stores_empty() -> bool:
    nodes = [n for n in lumos.state.list_nodes() if n["state"] == "ALIVE"]
    return len(nodes) == 2 and all(n["object_store_used_bytes"] == 0 for n in nodes)


def _store_used() -> int:
    return sum(n["object_store_used_bytes"] for n in lumos.state.list_nodes() if n["state"] == "ALIVE")


_DRIVER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import lumos
    lumos.init(address=sys.argv[1], _token=sys.argv[2])

    @lumos.remote(resources={"far": 1})
    def make():
        return np.ones(20 * 1024 * 1024 // 8)

    keep = [lumos.put(np.ones(20 * 1024 * 1024 // 8)) for _ in range(3)]
    far = make.remote()
    lumos.get(far, timeout=60)  # a copy of it is pulled to this node
    print(lumos.get_runtime_context().get_worker_id(), flush=True)
    if sys.argv[3] == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("how", ["exit", "kill"])
def test_objects_of_a_driver_that_exits_or_is_killed_are_freed_everywhere(two_nodes: Cluster,
                                                                            how: str) -> None:
    wait_for(_stores_empty, 10)
    proc = subprocess.run([sys.executable, "-c", _DRIVER, two_nodes.address, two_nodes.token, how],
                          capture_output=True, text=True, timeout=120, cwd=os.getcwd())
    assert proc.returncode == (0 if how == "exit" else -9), proc.stderr[-2000:]
    worker_id = proc.stdout.strip().splitlines()[-1]
    # 3 puts on the head node, a return on the far node and its copy here: all freed.
    wait_for(_stores_empty, 20)

    def row() -> dict[str, Any]:
        (found,) = [w for w in lumos.state.list_workers() if w["worker_id"] == worker_id]
        return found

    # The raylet frees the objects and reports the driver's death as it sees the
    # disconnect: the row may turn DEAD a moment after the stores are empty.
    wait_for(lambda: row()["state"] == "DEAD", 20)
    assert row()["is_driver"] and row()["end_time"], row()


def test_objects_an_actor_put_are_freed_with_it_also_copies_elsewhere(two_nodes: Cluster) -> None:
    import numpy as np
    wait_for(_stores_empty, 10)

    @lumos.remote(resources={"far": 1})
    class Producer:
        def make(self) -> list[Any]:
            return [lumos.put(np.ones(30 * MIB // 8))]

        def pid(self) -> int:
            return os.getpid()

    producer = Producer.remote()
    [ref] = lumos.get(producer.make.remote(), timeout=60)
    assert lumos.get(ref, timeout=60).shape == (30 * MIB // 8,)  # a copy on the head node too
    pid = lumos.get(producer.pid.remote(), timeout=30)
    wait_for(lambda: _store_used() >= 60 * MIB, 10)
    lumos.kill(producer)
    wait_for(lambda: not psutil.pid_exists(pid), 30, 0.05)
    wait_for(_stores_empty, 20)
