"""Owners on two nodes: a driver whose tasks spilled to node B holds B's resources, and B's
own owners take them back when it stops (Ctrl-Z) and does not return them (real nodes,
real drivers, real workers; ``test_fair_share.py`` is the one-node story)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


_LOOPING_ON_W = textwrap.dedent("""
    import sys, time
    import lumos

    lumos.init(address=sys.argv[1], _token=sys.argv[2])

    @lumos.remote(resources={"w": 1})
    def hold(i):
        time.sleep(0.01)
        return i

    while True:
        assert lumos.get([hold.remote(i) for i in range(20)], timeout=60) == list(range(20))
        print("looping", flush=True)
""")


@lumos.remote(resources={"w": 1})
def _on_w() -> str:
    return lumos.get_runtime_context().get_node_id()


@lumos.remote(num_cpus=0, resources={"b": 1})
class _OwnerOnB:
    """An owner on node B: its tasks' lease requests are B's own (local owner)."""

    def run_on_w(self) -> str:
        return lumos.get(_on_w.remote(), timeout=50)


def test_a_frozen_driver_on_another_node_gives_back_what_its_tasks_held_here() -> None:
    """A driver on the head whose tasks spilled to node B holds B's only "w"; an owner on B
    (an actor) asks for it and B recalls the lease. Stopped (Ctrl-Z), the driver never
    gives it back: B's raylet could look in /proc only for owners on its own node, so the
    actor's task waited as long as the driver stayed stopped. B asks the head's raylet now
    (``OwnersStopped``) and stops the lease's idle worker."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    frozen: subprocess.Popen[str] | None = None
    try:
        node_b = cluster.add_node(num_cpus=1, resources={"w": 1, "b": 1})
        cluster.wait_for_nodes()
        cluster.connect()
        owner = _OwnerOnB.remote()
        assert lumos.get(_on_w.remote(), timeout=60) == node_b.node_id
        frozen = subprocess.Popen([sys.executable, "-c", _LOOPING_ON_W, cluster.address, cluster.token],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=os.path.dirname(os.path.abspath(__file__)))
        assert frozen.stdout is not None
        for _ in range(3):  # its tasks run on B: "w" is leased to it
            assert frozen.stdout.readline().strip() == "looping"
        os.kill(frozen.pid, signal.SIGSTOP)
        t = time.time()
        assert lumos.get(owner.run_on_w.remote(), timeout=60) == node_b.node_id
        took = time.time() - t
        os.kill(frozen.pid, signal.SIGCONT)
        assert frozen.stdout.readline().strip() == "looping"  # and it carries on
        assert took < 40, took  # (about RECALL_HOLD_S and a second)
    finally:
        if frozen is not None:
            if frozen.poll() is None:
                os.kill(frozen.pid, signal.SIGCONT)
                frozen.kill()
            frozen.communicate(timeout=30)
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
