"""The status page shows object spilling per node, read through ``lumos.state``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
from typing import Any, Iterator

import numpy as np
import pytest

import lumos
from lumos.state import StateClient
from tests.conftest import running_cluster
from tests.dashboard.conftest import column, screenshot, wait_doc
from tests.dashboard.test_pages import login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(180)]

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def small_store() -> Iterator[lumos.LumosContext]:
    """A 64 MiB object store, so 96 MiB of puts spill."""
    yield from running_cluster(object_store_memory=64 * MIB, include_dashboard=True)


def test_spilled_objects_appear_on_the_status_page(small_store: lumos.LumosContext, page: Any) -> None:
    refs = [lumos.put(np.full(MIB // 2, i, dtype=np.float64)) for i in range(24)]  # 24 x 4 MiB
    (row,) = lumos.state.spill_stats()
    assert row["spilled_objects"] > 0

    # The async client the dashboard uses gives the same rows.
    async def read() -> list[dict[str, Any]]:
        client = StateClient.for_current_cluster()
        await client.connect()
        try:
            return await client.spill_stats()
        finally:
            client.close()
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # Playwright runs a loop on this thread
        (async_row,) = pool.submit(asyncio.run, read()).result(60)
    assert async_row["node_id"] == row["node_id"] and async_row["spilled_objects"] >= row["spilled_objects"]

    login(page, small_store, "/status")
    node_id = small_store.address_info["node_id"]
    wait_doc(page, f"(d, col) => col('spill_table', 'node').some(n => n.startsWith('{node_id[:8]}'))")
    spilled = column(page, "spill_table", "spilled")[0]
    assert int(spilled.split(" objects")[0]) >= row["spilled_objects"] and "MiB" in spilled
    assert column(page, "spill_table", "disk") == ["ok"]
    assert "spilled in all" in page.locator(".lumos-spilled").inner_text()
    # Restores show up too (a spilled object read back).
    assert float(lumos.get(refs[0], timeout=60)[0]) == 0.0
    wait_doc(page, "(d, col) => col('spill_table', 'restored').some(r => !r.startsWith('0 objects'))", 30)
    screenshot(page, "status_spill")
    del refs
    gc.collect()
