"""Node failure across real raylet processes: nothing waiting on a dead node hangs."""

from __future__ import annotations

from typing import Any

import pytest

import lumos
from lumos.testing import Cluster
from tests.conftest import TEST_CONFIG, check_no_leaks, wait_for


@pytest.mark.slow
def test_object_on_a_dead_node_raises_object_lost() -> None:
    import numpy as np
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": dict(TEST_CONFIG)})
    try:
        node = cluster.add_node(num_cpus=1, resources={"doomed": 1})
        cluster.connect()

        @lumos.remote(resources={"doomed": 1}, max_retries=0)
        def make() -> Any:
            return np.ones(2_000_000)

        ref = make.remote()
        lumos.wait([ref], timeout=60)
        cluster.remove_node(node)
        wait_for(lambda: not [n for n in lumos.nodes() if n["NodeID"] == node.node_id and n["Alive"]], 10)
        with pytest.raises(lumos.exceptions.ObjectLostError, match="could not be copied"):
            lumos.get(ref, timeout=30)
    finally:
        cluster.shutdown()
        check_no_leaks(cluster.session_dir)
