"""Bottom-up scheduling with locality: a task runs where its large argument is."""

from __future__ import annotations

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_task_on_a_50mb_argument_runs_where_the_argument_is() -> None:
    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "_system_config": dict(TEST_CONFIG)})
    try:
        other = cluster.add_node(num_cpus=2, resources={"maker": 1}, object_store_memory=512 * 1024 * 1024)
        cluster.connect()

        @lumos.remote(resources={"maker": 1})
        def make() -> np.ndarray:
            return np.ones(50 * 1024 * 1024 // 8)

        @lumos.remote
        def where(arr: np.ndarray) -> tuple[str, float]:
            return lumos.get_runtime_context().get_node_id(), float(arr[:10].sum())

        @lumos.remote
        def plain() -> str:
            return lumos.get_runtime_context().get_node_id()

        big = make.remote()
        lumos.wait([big], timeout=60, fetch_local=False)  # (no copy here)
        head = cluster.head_node.node_id
        # Without large arguments work stays on the driver's node while it fits ...
        assert lumos.get(plain.remote(), timeout=30) == head
        # ... with a 50 MB argument made on the other node, it runs there (no transfer).
        for _ in range(3):
            node, total = lumos.get(where.remote(big), timeout=60)
            assert total == 10.0
            assert node == other.node_id
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
