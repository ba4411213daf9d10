"""Local owners first: a raylet recalls the task lease it granted to an owner on another
node when an owner on its own node waits for those resources (real raylets, real workers).

Without the recall, a driver with a backlog kept the only CPU of another node until its
backlog was done, and that node's own work waited behind all of it.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

import pytest

import lumos
from lumos.testing import Cluster
from lumos.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from tests.conftest import running_two_nodes

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def two_one_cpu_nodes() -> Iterator[tuple[Cluster, Any]]:
    yield from running_two_nodes(1, num_cpus=1)


@lumos.remote
def work(i: int, sleep_s: float) -> tuple[int, str, float, float]:
    start = time.time()
    time.sleep(sleep_s)
    return i, lumos.get_runtime_context().get_node_id(), start, time.time()


@lumos.remote(num_cpus=0)
class LocalOwner:
    """An owner that lives on the second node: what it submits asks that node's raylet first."""

    def run_here(self, node_id: str) -> tuple[str, float, float]:
        here = NodeAffinitySchedulingStrategy(node_id, soft=False)
        asked = time.time()
        _, where, start, _ = lumos.get(work.options(scheduling_strategy=here).remote(-1, 0.0), timeout=60)
        return where, asked, start


def test_an_owner_on_the_node_gets_its_cpu_back_from_a_spilled_in_backlog(
        two_one_cpu_nodes: tuple[Cluster, Any]) -> None:
    cluster, node = two_one_cpu_nodes
    owner = LocalOwner.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
    lumos.get(owner.run_here.remote(node.node_id), timeout=60)  # its worker and lease path are warm
    # The driver (on the head, one CPU) floods both nodes: its second lease spilled to the other node.
    backlog = [work.remote(i, 0.05) for i in range(80)]
    ready, _ = lumos.wait(backlog, num_returns=4, timeout=30)
    ran = lumos.get(ready, timeout=30)
    deadline = time.time() + 20
    while node.node_id not in {r[1] for r in ran} and time.time() < deadline:
        ready, _ = lumos.wait(backlog, num_returns=min(len(backlog), len(ran) + 2), timeout=10)
        ran = lumos.get(ready, timeout=30)
    assert node.node_id in {r[1] for r in ran}, "the backlog never spilled to the second node"

    where, asked, started = lumos.get(owner.run_here.remote(node.node_id), timeout=60)
    assert where == node.node_id
    results = lumos.get(backlog, timeout=60)
    assert sorted(r[0] for r in results) == list(range(80))  # none lost to the recall
    later = [r for r in results if r[2] > started]
    # The local owner's task ran while the backlog still had work to start (it took the
    # CPU back after the one task in flight there), not after the whole backlog.
    assert len(later) >= 10, (started - asked, len(later))
