"""A GCS that stood still (SIGSTOP, swapped out, starved of CPU) does not declare the
nodes dead whose heartbeats it could not read meanwhile."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterator

import pytest

import lumos
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG, check_no_leaks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

CONFIG = {**TEST_CONFIG, "heartbeat_interval_ms": 100, "node_death_timeout_ms": 1000}


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
        time.sleep(3.0)  # three death timeouts without reading a heartbeat
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    time.sleep(1.5)  # more than one death timeout after it resumed: a wrong verdict would show
    nodes = lumos.state.list_nodes(timeout=30)
    assert {n["node_id"]: n["state"] for n in nodes} == {n: "ALIVE" for n in before}
    side = where.options(resources={"side": 1}).remote()
    assert lumos.get(side, timeout=30) in before
