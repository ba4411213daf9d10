"""Measurements for the dashboard (not a test; run by hand):

    python tests/dashboard/bench_dashboard.py throughput   # task throughput, dashboard off vs on with a page open
    python tests/dashboard/bench_dashboard.py graph        # 10,000 tasks in the task graph

Each mode runs on a fresh 2-CPU cluster; "on" keeps a headless Chromium on the task
stream page the whole time (the dashboard polls only while a page is open).
"""

from __future__ import annotations

import shutil
import sys
import time
from typing import Any

import lumos


@lumos.remote
def noop(*args: Any) -> None:
    return None


def throughput(n: int = 5000, rounds: int = 3) -> float:
    lumos.get([noop.remote() for _ in range(500)], timeout=120)
    best = 0.0
    for _ in range(rounds):
        t = time.perf_counter()
        lumos.get([noop.remote() for _ in range(n)], timeout=300)
        best = max(best, n / (time.perf_counter() - t))
    return best


def open_page(ctx: Any, page: str) -> tuple[Any, Any, Any]:
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    b = pw.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                           args=["--no-sandbox", "--disable-gpu", "--disable-quic"])
    pg = b.new_page(viewport={"width": 1280, "height": 900})
    pg.goto(ctx.dashboard_url + f"&page={page}")
    pg.wait_for_function("() => window.Bokeh && Bokeh.documents.length > 0", timeout=30_000)
    return pw, b, pg


def bench_throughput() -> None:
    results: dict[str, list[float]] = {"off": [], "on": []}
    for mode in ("off", "on", "off", "on"):
        ctx = lumos.init(num_cpus=2, include_dashboard=(mode == "on"), log_to_driver=False)
        handles = open_page(ctx, "tasks") if mode == "on" else None
        try:
            results[mode].append(throughput())
        finally:
            if handles:
                handles[1].close()
                handles[0].stop()
            lumos.shutdown()
    off, on = max(results["off"]), max(results["on"])
    print(f"async tasks/s  dashboard off: {off:.0f}  on (task stream open): {on:.0f}  "
          f"change: {100 * (on - off) / off:+.1f}%   runs: {results}")


def bench_graph(n: int = 10_000) -> None:
    from lumos.dashboard.graph_layout import GraphLayout
    ctx = lumos.init(num_cpus=2, include_dashboard=True, log_to_driver=False)
    pw, b, pg = open_page(ctx, "graph")
    try:
        t = time.perf_counter()
        refs = [noop.remote() for _ in range(n)]
        lumos.get(refs, timeout=600)
        ran = time.perf_counter() - t
        t = time.perf_counter()
        pg.wait_for_function(
            f"() => {{ const m = Bokeh.documents[0].get_model_by_name('nodes'); const d = m.data_source.data;"
            f" const c = d instanceof Map ? d.get('count') : d.count; return c && c.length && c[0] >= {n}; }}",
            timeout=180_000, polling=100)
        shown = time.perf_counter() - t
        # Interaction stays quick: time a zoom round trip in the browser.
        t = time.perf_counter()
        pg.mouse.move(600, 400)
        pg.mouse.wheel(0, -300)
        pg.wait_for_timeout(50)
        pg.evaluate("() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")
        frame = time.perf_counter() - t - 0.05
        # Server-side cost of one rebuild of the grouped graph, and of the ungrouped one.
        from lumos.dashboard.source import ClusterSource
        from lumos.state import StateClient
        import asyncio
        client = StateClient.for_session(ctx.address_info["session_dir"])
        src = ClusterSource(client)

        async def load() -> None:
            await client.connect()
            await src.poll()
            client.close()
        import threading
        loader = threading.Thread(target=lambda: asyncio.run(load()))  # Playwright owns this thread's loop
        loader.start()
        loader.join(60)
        layout = GraphLayout(500)
        t = time.perf_counter()
        layout.build(src.tasks.values(), src.producer)
        grouped = time.perf_counter() - t
        t = time.perf_counter()
        layout.build(src.tasks.values(), src.producer)
        again = time.perf_counter() - t
        t = time.perf_counter()
        nodes, edges = GraphLayout(10 ** 9).build(src.tasks.values(), src.producer)
        flat = time.perf_counter() - t
        print(f"{n} tasks ran in {ran:.1f}s; graph showed them all {shown:.2f}s after the last finished; "
              f"zoom frame {frame * 1000:.0f} ms; grouped build {grouped * 1000:.0f} ms (again {again * 1000:.0f} ms); "
              f"ungrouped build {flat * 1000:.0f} ms for {len(nodes['id'])} nodes")
    finally:
        b.close()
        pw.stop()
        lumos.shutdown()


if __name__ == "__main__":
    {"throughput": bench_throughput, "graph": bench_graph}[sys.argv[1]]()
