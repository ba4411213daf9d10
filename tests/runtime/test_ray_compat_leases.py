"""Leases held idle by one function do not starve another (each test starts its own cluster)."""

from __future__ import annotations

from typing import Any

import lumos


@lumos.remote
def burst_item(i: int) -> int:
    return i


@lumos.remote
def other_function() -> str:
    return "ran"


def test_idle_leases_of_one_function_do_not_starve_another(fresh_cluster: Any) -> None:
    # Idle leases are kept a minute here: the second function gets a worker only because
    # this process gives back the workers it holds idle for the first (and any lease
    # granted after the burst ended) instead of waiting for them to time out.
    fresh_cluster(num_cpus=2, _system_config={"lease_idle_timeout_ms": 60_000})
    assert lumos.get([burst_item.remote(i) for i in range(200)], timeout=60) == list(range(200))
    assert lumos.get(other_function.remote(), timeout=30) == "ran"
    assert lumos.get([burst_item.remote(i) for i in range(20)], timeout=20) == list(range(20))
