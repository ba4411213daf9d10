"""Values a driver got and dropped go back to the store's pool of files (their pages are
reused by the next values of that size, not allocated and zeroed again)."""

from __future__ import annotations

import glob
import os
from typing import Any, Callable

import numpy as np
import pytest

import lumos
from tests.conftest import wait_for

pytestmark = pytest.mark.timeout(120)


@lumos.remote
def make_mib() -> np.ndarray:
    return np.ones(1 << 20, dtype=np.uint8)


def test_returns_dropped_with_their_refs_are_recycled(fresh_cluster: Callable[..., Any]) -> None:
    ctx = fresh_cluster()
    store = glob.glob("/dev/shm/lumos-" + os.path.basename(ctx.address_info["session_dir"]) + "-*")[0]

    def pooled() -> int:
        return sum(1 for name in os.listdir(store) if name.startswith("pool-"))

    for _ in range(4):
        before = pooled()
        values = lumos.get([make_mib.remote() for _ in range(50)], timeout=60)  # the refs go here
        assert all(v[0] == 1 for v in values)
        del values  # then the views, within the same flush interval: unpins and frees meet
        # Pooled only when the raylet has the unpins before the frees (pinned at the free:
        # the files were unlinked, and every next round allocated fresh pages).
        wait_for(lambda: pooled() >= before + 50 or pooled() >= 50, 10)
