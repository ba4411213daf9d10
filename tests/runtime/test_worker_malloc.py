"""Workers fix glibc malloc's thresholds (``worker_malloc_*``): numpy temporaries of a
task come from the heap instead of a fresh mmap each, whatever the worker ran before."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import lumos

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="glibc malloc")]


@lumos.remote
def probe() -> dict[str, Any]:
    import numpy as np

    def minflt() -> int:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[7])

    big = np.empty(3 << 20, np.uint8)
    with open("/proc/self/maps") as f:
        heap = [tuple(int(x, 16) for x in line.split()[0].split("-")) for line in f if line.rstrip().endswith("[heap]")]
    in_heap = any(lo <= big.ctypes.data < hi for lo, hi in heap)
    del big
    frame = np.ones((128, 128, 4), np.uint8)
    for _ in range(20):  # warm
        np.asarray(frame, dtype=np.float32) + np.asarray(frame, dtype=np.float32)
    before = minflt()
    for _ in range(200):  # two 256 KiB temporaries made and freed per round
        np.asarray(frame, dtype=np.float32) + np.asarray(frame, dtype=np.float32)
    return {"in_heap": in_heap, "faults_per_round": (minflt() - before) / 200}


def test_a_workers_numpy_temporaries_stay_on_the_heap(fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster()
    got = lumos.get(probe.remote(), timeout=60)
    assert got["in_heap"], got  # glibc's start: anything above 128 KiB is a fresh mmap
    assert got["faults_per_round"] < 5, got  # ~200 when each temporary is mapped and unmapped


def test_zero_keeps_glibcs_adaptive_thresholds(fresh_cluster: Callable[..., Any]) -> None:
    fresh_cluster(_system_config={"worker_malloc_mmap_threshold_bytes": 0})
    got = lumos.get(probe.remote(), timeout=60)
    assert not got["in_heap"], got
