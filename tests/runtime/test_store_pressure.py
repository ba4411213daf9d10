"""A node's object store under pressure, across real raylet processes."""

from __future__ import annotations

from typing import Any

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_copies_pulled_to_a_full_store_are_evicted_for_new_objects() -> None:
    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        cluster.add_node(num_cpus=1, resources={"small": 1}, object_store_memory=100 * 1024 * 1024)
        cluster.connect()

        @lumos.remote(resources={"small": 1})
        def total(a: Any) -> float:
            return float(a.sum())

        @lumos.remote(resources={"small": 1})
        def make_big() -> float:
            return float(lumos.get(lumos.put(np.ones(5_000_000))).sum())  # 40 MB made there

        arrays = [lumos.put(np.full(3_750_000, float(i))) for i in range(3)]  # 30 MB each, on the head
        # Each read copies the array into the small node's store: 90 of its 100 MB.
        assert lumos.get([total.remote(a) for a in arrays], timeout=60) == [0.0, 3_750_000.0, 7_500_000.0]
        # The new object fits only once older copies go (the arrays still live on the head).
        assert lumos.get(make_big.remote(), timeout=60) == 5_000_000.0
        # A copy that was evicted is pulled again when needed.
        assert lumos.get(total.remote(arrays[0]), timeout=60) == 0.0
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
