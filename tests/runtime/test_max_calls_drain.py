"""A worker that exits after a function's ``max_calls`` (a GPU task's default is 1) first
waits for the objects it owns that others still hold, as Ray's workers drain: they were
lost with it (``OwnerDiedError``). Its resources go back at once all the same."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import psutil
import pytest

import lumos
from tests.conftest import process_gone, wait_for


@lumos.remote(max_calls=1)
def put_inside() -> tuple[int, list[Any]]:
    # one value in the store, one small (inline, in the owner's memory)
    return os.getpid(), [lumos.put(np.full(100_000, 9)), lumos.put("small")]


@lumos.remote(num_gpus=1)  # max_calls defaults to 1 for GPU tasks
def gpu_put() -> tuple[int, Any]:
    return os.getpid(), lumos.put(np.ones(100_000))


@lumos.remote(num_gpus=1, num_returns="dynamic")
def gpu_values(n: int) -> Any:
    for i in range(n):
        yield np.full(10, i)



@pytest.mark.timeout(120)
def test_objects_a_max_calls_worker_owns_outlive_its_last_task(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=2, num_gpus=1)
    pid, refs = lumos.get(put_inside.remote(), timeout=60)
    time.sleep(1.0)  # (it used to be gone by now, and its objects with it)
    assert int(lumos.get(refs[0], timeout=30)[0]) == 9 and lumos.get(refs[1], timeout=30) == "small"
    assert not process_gone(pid)

    gpu_pid, weights = lumos.get(gpu_put.remote(), timeout=60)
    # Its GPU went back with its last reply: the next GPU task runs while it drains.
    gen = lumos.get(gpu_values.remote(3), timeout=60)
    assert [int(lumos.get(r, timeout=30)[0]) for r in gen] == [0, 1, 2]
    assert float(lumos.get(weights, timeout=30).sum()) == 100_000.0
    assert not process_gone(gpu_pid) and lumos.available_resources().get("GPU") == 1.0

    # Once nothing references what they own, they leave.
    del refs, weights
    wait_for(lambda: process_gone(pid) and process_gone(gpu_pid), 30, 0.1)
