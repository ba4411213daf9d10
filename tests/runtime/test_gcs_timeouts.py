"""Calls that need the GCS honour the caller's timeout while it is stopped or down:
``GetTimeoutError`` (a ``TimeoutError``), or ``False`` from ``PlacementGroup.wait``."""

from __future__ import annotations

import os
import signal
from typing import Any, Callable, Iterator

import pytest

import lumos
from lumos.exceptions import GetTimeoutError
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG, RedisServer, check_no_leaks, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture
def cluster(redis_server_factory: Callable[..., RedisServer]) -> Iterator[Cluster]:
    url = redis_server_factory().url
    c = Cluster(initialize_head=True,
                head_node_args={"num_cpus": 1, "_system_config": {**TEST_CONFIG, "gcs_storage": url}})
    try:
        yield c
    finally:
        c.shutdown()
        check_no_leaks(c.session_dir)


def _gcs_pid(cluster: Cluster) -> int:
    proc = cluster._head_processes().gcs_proc
    assert proc is not None
    return proc.pid


def _timeouts_are_honoured(pg: Any) -> None:
    with pytest.raises(GetTimeoutError) as info:
        lumos.state.list_actors(timeout=0.5)
    assert isinstance(info.value, TimeoutError) and "ListActors timed out after 0.5s" in str(info.value)
    with pytest.raises(GetTimeoutError):
        lumos.state.list_nodes(timeout=0.5)
    with pytest.raises(GetTimeoutError):
        lumos.state.list_tasks(timeout=0.5)
    assert pg.wait(timeout_seconds=0.5) is False  # not an error, as when it is merely not ready


def test_a_stopped_gcs_gives_timeouts_not_hangs(cluster: Cluster) -> None:
    cluster.connect()
    pg = lumos.util.placement_group([{"CPU": 64}])  # never ready on this 1-CPU cluster
    pid = _gcs_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        _timeouts_are_honoured(pg)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert lumos.state.list_actors(timeout=30) == []


def test_a_killed_gcs_gives_timeouts_until_it_is_back(cluster: Cluster) -> None:
    cluster.connect()
    pg = lumos.util.placement_group([{"CPU": 64}])
    cluster.kill_gcs()
    from lumos import object_ref
    cw: Any = object_ref._core_worker
    wait_for(lambda: cw._gcs_reconnecting, 10)  # the driver saw the GCS go
    _timeouts_are_honoured(pg)
    cluster.restart_gcs()
    assert [n["state"] for n in lumos.state.list_nodes(timeout=30)] == ["ALIVE"]
    assert pg.wait(timeout_seconds=0.5) is False


def test_a_bad_timeout_is_refused() -> None:
    with pytest.raises(ValueError, match="timeout must be None or a number"):
        lumos.state.list_tasks(timeout=-1)
