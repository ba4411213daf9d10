"""An actor without a name is registered with the GCS in the background: ``.remote()``
returns before the GCS answers, its calls queue behind the registration, and a
registration that fails fails its calls (no hang)."""

from __future__ import annotations

import os
import signal
import time
from typing import Iterator

import pytest

import lumos
from lumos import exceptions as exc
from lumos.testing import Cluster

from tests.conftest import TEST_CONFIG

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": TEST_CONFIG})
    try:
        yield c
    finally:
        c.shutdown()


@lumos.remote(num_cpus=0)
class Counter:
    def __init__(self, start: int) -> None:
        self.n = start

    def add(self, k: int) -> int:
        self.n += k
        return self.n


def _gcs_pid(cluster: Cluster) -> int:
    proc = cluster._head_processes().gcs_proc
    assert proc is not None
    return int(proc.pid)


def test_remote_returns_while_the_gcs_is_stopped_and_calls_wait_for_it(cluster: Cluster) -> None:
    cluster.connect()
    lumos.get(Counter.remote(0).add.remote(1), timeout=60)  # the class is exported, the cluster warm
    pid = _gcs_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        handles = [Counter.remote(i) for i in range(5)]  # would block on the stopped GCS before
        refs = [h.add.remote(10) for h in handles]
        ready, _ = lumos.wait(refs, num_returns=len(refs), timeout=0.5)
        assert ready == []  # nothing can be created while the GCS is stopped
        stopped_kill = Counter.remote(100)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert lumos.get(refs, timeout=60) == [10 + i for i in range(5)]
    lumos.kill(stopped_kill)  # right after .remote(): waits for the registration, then ends it
    with pytest.raises(exc.ActorDiedError):
        lumos.get(stopped_kill.add.remote(1), timeout=60)


def test_a_handle_passed_on_before_the_registration_is_answered_works(cluster: Cluster) -> None:
    cluster.connect()

    @lumos.remote(num_cpus=0)
    def call(h: "lumos.actor.ActorHandle") -> int:
        return int(lumos.get(h.add.remote(5)))

    pid = _gcs_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    try:
        h = Counter.remote(1)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert lumos.get(call.remote(h), timeout=60) == 6


def test_a_failed_registration_fails_the_actors_calls(cluster: Cluster) -> None:
    cluster.connect()
    lumos.get(Counter.remote(0).add.remote(1), timeout=60)
    pid = _gcs_pid(cluster)
    os.kill(pid, signal.SIGSTOP)
    h = Counter.remote(0)
    before = h.add.remote(1)
    time.sleep(0.2)  # the RegisterActor is on its way to the stopped GCS
    os.kill(pid, signal.SIGKILL)  # no durable storage: the registration is lost with it
    with pytest.raises((exc.ActorDiedError, exc.LumosSystemError)) as e:
        lumos.get(before, timeout=60)
    assert "GCS" in str(e.value)
    with pytest.raises((exc.ActorDiedError, exc.LumosSystemError)):
        lumos.get(h.add.remote(1), timeout=60)
