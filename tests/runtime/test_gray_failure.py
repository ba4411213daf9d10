"""Gray failure: a node that is frozen (SIGSTOP), not crashed. Once the GCS declares it
dead, owners fail over its tasks and actor calls exactly as if its sockets had closed,
refuse what it sends from then on, and the node is fenced: when it runs again it exits
with its workers, and it may rejoin only as a new node."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psutil
import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, process_gone, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def node_processes(raylet_pid: int) -> list[psutil.Process]:
    """A node's raylet and its workers (the processes a freeze stops)."""
    raylet = psutil.Process(raylet_pid)
    return [raylet] + raylet.children(recursive=True)


def freeze(procs: list[psutil.Process]) -> None:
    for p in procs:  # the raylet first: it starts no worker while we stop the others
        try:
            p.send_signal(signal.SIGSTOP)
        except psutil.NoSuchProcess:
            pass


def thaw(procs: list[psutil.Process]) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGCONT)
        except psutil.NoSuchProcess:
            pass


def alive(node_id: str) -> bool:
    return any(n["NodeID"] == node_id and n["Alive"] for n in lumos.nodes())


@lumos.remote(resources={"w": 1}, max_retries=2)
def stuck_once(marker: str) -> tuple[str, int]:
    """Hangs in its first attempt (the one on the node that is frozen), returns in the next."""
    first = not os.path.exists(marker)
    if first:
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(60)
    return lumos.get_runtime_context().get_node_id(), os.getpid()


@lumos.remote(resources={"w": 1}, max_restarts=1, max_task_retries=-1)
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def slow_add(self, marker: str) -> tuple[int, int]:
        if not os.path.exists(marker):
            with open(marker, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(60)
        self.n += 1
        return self.n, os.getpid()

    def add(self) -> tuple[int, int]:
        self.n += 1
        return self.n, os.getpid()


def test_a_frozen_node_is_failed_over_and_fenced(tmp_path: Any) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    try:
        doomed = cluster.add_node(num_cpus=2, resources={"w": 2})
        cluster.connect()
        counter = Counter.remote()
        assert lumos.get(counter.add.remote(), timeout=60)[0] == 1
        task_marker, call_marker = str(tmp_path / "task"), str(tmp_path / "call")
        task_ref = stuck_once.remote(task_marker)
        call_ref = counter.slow_add.remote(call_marker)
        wait_for(lambda: os.path.exists(task_marker) and os.path.exists(call_marker), 60, 0.05)
        later_ref = counter.add.remote()  # queued behind the call in flight
        spare = cluster.add_node(num_cpus=2, resources={"w": 2})
        procs = node_processes(doomed.raylet_pid)
        with open(call_marker) as f:
            old_actor_pid = int(f.read())
        freeze(procs)
        wait_for(lambda: not alive(doomed.node_id), 30, 0.1)

        # Failed over as if its sockets had closed: the task ran again elsewhere, and the
        # actor's call in flight ran again, in order, on the restarted actor.
        node, _pid = lumos.get(task_ref, timeout=60)
        assert node == spare.node_id
        (n1, pid1), (n2, pid2) = lumos.get([call_ref, later_ref], timeout=60)
        assert (n1, n2) == (1, 2) and pid1 == pid2 != old_actor_pid

        # Fenced: once it runs again, the node exits with its workers (the old actor too).
        thaw(procs)
        wait_for(lambda: all(process_gone(p.pid) for p in procs), 30, 0.1)
        assert lumos.get(counter.add.remote(), timeout=30) == (3, pid1)
        assert not alive(doomed.node_id)
        (row,) = [a for a in lumos.state.list_actors() if a["class_name"] == "Counter"]
        assert row["state"] == "ALIVE" and row["pid"] == pid1 and row["node_id"] == spare.node_id
        (task_row,) = [r for r in lumos.state.list_tasks() if r["name"] == "stuck_once"]
        assert task_row["state"] == "FINISHED" and task_row["attempt_number"] == 1, task_row
        # It may rejoin only as a new node: registering under its old id is refused.
        reasons, error = _register_again(cluster, doomed.node_id)
        assert "may rejoin only as a new node" in error and reasons, (error, reasons)
    finally:
        thaw(procs)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


def _register_again(cluster: Cluster, node_id: str) -> tuple[list[str], str]:
    """Register a node under ``node_id`` again, as its raylet would: ``(the reasons of the
    ShutdownNode messages the GCS sent, the error the registration raised)``."""
    import asyncio

    from lumos._private import worker_context
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import RemoteError, connect, parse_address
    (info,) = [n for n in worker_context.require().call_gcs(m.GetAllNodes()) if n.node_id.hex() == node_id]
    reasons: list[str] = []

    async def register() -> str:
        conn = await connect(parse_address(cluster.address), token=cluster.token.encode(),
                             config=cluster._config, name="test->gcs",
                             handlers={m.ShutdownNode: lambda c, msg: reasons.append(msg.reason)})
        try:
            await conn.call(m.RegisterNode(info), 10.0)
        except RemoteError as e:
            return str(e)
        finally:
            conn.close()
        return "registered"

    return reasons, asyncio.run(register())


@lumos.remote
def _nothing() -> int:
    return 1


def test_a_driver_whose_own_node_is_declared_dead_fails_at_once(tmp_path: Any) -> None:
    # The driver's raylet frozen: once the GCS declared its node dead, what waited on it
    # (a task's lease, a get) went on waiting for ever, and a put until its call timed out.
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    try:
        cluster.connect()
        assert lumos.get(_nothing.remote(), timeout=60) == 1
        head = cluster.head_node
        assert head is not None
        procs = node_processes(head.raylet_pid)
        time.sleep(0.5)  # (the worker's lease went back to the raylet)
        freeze(procs)
        start = time.monotonic()
        ref = _nothing.remote()
        with pytest.raises(lumos.exceptions.ClusterUnavailableError, match="node was declared dead"):
            lumos.get(ref, timeout=60)
        assert time.monotonic() - start < 30
        with pytest.raises(lumos.exceptions.ClusterUnavailableError, match="node was declared dead"):
            lumos.get(_nothing.remote(), timeout=10)
        start = time.monotonic()
        with pytest.raises(lumos.exceptions.ClusterUnavailableError) as info:
            lumos.put(b"x" * (1 << 20))
        assert time.monotonic() - start < 5 and "node was declared dead" in str(info.value)
    finally:
        thaw(procs)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@lumos.remote(max_retries=3)
def _big() -> Any:
    import numpy as np
    return np.ones(600 << 20, dtype=np.uint8)


def test_a_pull_from_a_node_frozen_mid_transfer_fails_over_when_it_is_declared_dead() -> None:
    # The pull's data streams waited out their socket timeout (30 s) after the GCS declared
    # the holder dead; now they are shut then, and the owner rebuilds the value.
    from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 2 << 30, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    try:
        holder = cluster.add_node(num_cpus=1, object_store_memory=2 << 30)
        cluster.connect()
        ref = _big.options(scheduling_strategy=NodeAffinitySchedulingStrategy(holder.node_id, soft=True)).remote()
        lumos.wait([ref], fetch_local=False, timeout=120)
        procs = node_processes(holder.raylet_pid)

        def freeze_soon() -> None:
            time.sleep(0.05)
            freeze(procs)

        import threading
        threading.Thread(target=freeze_soon).start()
        start = time.monotonic()
        value = lumos.get(ref, timeout=120)
        took = time.monotonic() - start
        assert value.shape == (600 << 20,) and value[-1] == 1
        del value
        assert took < 25, f"the get took {took:.1f}s"
    finally:
        thaw(procs)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


_DRIVER_ON_THE_HEAD = """
import os, sys, time
import lumos
lumos.init(address=sys.argv[1], _token=sys.argv[2])

@lumos.remote(resources={"w": 1})
def hold(i):
    time.sleep(0.05)
    return os.getpid()

while True:
    print("looping", *set(lumos.get([hold.remote(i) for i in range(4)], timeout=60)), flush=True)
"""


def test_the_leases_of_an_owner_on_a_node_declared_dead_go_back(tmp_path: Any) -> None:
    """A driver on the head whose tasks run on node B (their leases spilled there), frozen
    with its node: once the GCS declared the head's raylet dead, and the driver with it,
    node B still lent its only "w" to the driver, for as long as the driver stayed frozen
    (its connection to B never closed). B now ends the leases of an owner the GCS says
    died, and stops their workers."""
    import asyncio
    import subprocess
    import sys
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    driver: subprocess.Popen[str] | None = None
    try:
        node_b = cluster.add_node(num_cpus=1, resources={"w": 1})
        cluster.wait_for_nodes()
        driver = subprocess.Popen([sys.executable, "-c", _DRIVER_ON_THE_HEAD, cluster.address, cluster.token],
                                  stdout=subprocess.PIPE, text=True)
        assert driver.stdout is not None
        pids: set[int] = set()
        for _ in range(3):
            word, *more = driver.stdout.readline().split()
            assert word == "looping"
            pids.update(map(int, more))

        def w_available() -> float:
            async def ask() -> float:
                client = lumos.state.StateClient(cluster.address, cluster.token)
                await client.connect(10)
                try:
                    rows = {bytes(r.node_id).hex(): r for r in await client.node_resources()}
                finally:
                    client.close()
                return float(rows[node_b.node_id].available.get("w", 0.0))
            return asyncio.run(ask())

        head = cluster.head_node
        assert head is not None
        procs = node_processes(head.raylet_pid) + [psutil.Process(driver.pid)]
        freeze(procs)
        assert w_available() == 0.0
        wait_for(lambda: w_available() == 1.0, 40)
        for pid in pids:  # the worker it leased on B is stopped
            wait_for(lambda: process_gone(pid), 20)
    finally:
        thaw(procs)
        if driver is not None:
            driver.kill()
            driver.communicate(timeout=30)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)


@lumos.remote(resources={"accel": 1})
class _Holder:
    def node(self) -> str:
        return lumos.get_runtime_context().get_node_id()


def test_a_thawed_fenced_node_asking_to_move_its_queued_leases_logs_no_error() -> None:
    """A node frozen while it held queued lease requests (actors waiting for the one
    "accel" unit its actor holds) asks the GCS, once thawed and before it hears it was
    declared dead, where to move them. The GCS's refusal ("not alive in the GCS's view")
    is an answer, and the thawed node exits; it was logged as an ERROR with a traceback."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    procs: list[psutil.Process] = []
    try:
        doomed = cluster.add_node(num_cpus=1, resources={"accel": 1})
        cluster.connect()
        holder = _Holder.remote()
        assert lumos.get(holder.node.remote(), timeout=60) == doomed.node_id
        waiting = [_Holder.remote() for _ in range(3)]  # (their leases queue on the doomed node)
        time.sleep(1.0)
        procs = node_processes(doomed.raylet_pid)
        freeze(procs)
        wait_for(lambda: not alive(doomed.node_id), 30, 0.1)
        thaw(procs)
        wait_for(lambda: all(process_gone(p.pid) for p in procs), 30, 0.1)
        spare = cluster.add_node(num_cpus=1, resources={"accel": 1})
        assert lumos.get(waiting[0].node.remote(), timeout=60) == spare.node_id  # (the cluster goes on)
        with open(os.path.join(cluster.session_dir, "logs", "gcs.log")) as f:
            errors = [line for line in f if " ERROR " in line]
        assert errors == [], errors
    finally:
        thaw(procs)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
