"""Every dashboard page of a live cluster, rendered by a real headless Chromium.

The cluster runs tasks (with nested children, data dependencies, a failure, a GPU
task) and an actor; each page's rendered Bokeh document is checked and screenshotted
into test-artifacts/dashboard/.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

import lumos
from lumos.dashboard.components.status import COLUMNS
from lumos.dashboard.graph_layout import STATE_COLORS
from tests.conftest import wait_for
from tests.dashboard.conftest import base_url, column, screenshot, wait_doc

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

EVIL = "<img src=x onerror=window.__pwned=1>"
COLUMN_NAMES = [k for k, _ in COLUMNS]


@lumos.remote
def square(x: int) -> int:
    return x * x


@lumos.remote
def total(*xs: int) -> int:
    return sum(xs)


@lumos.remote
def fan_out(n: int) -> int:
    return sum(lumos.get([square.remote(i) for i in range(n)], timeout=30))


@lumos.remote(num_gpus=1)
def gpu_hold(seconds: float) -> list[int]:
    time.sleep(seconds)
    return lumos.get_gpu_ids()


@lumos.remote(max_retries=0)
def explode() -> None:
    raise ValueError("<script>window.__pwned=2</script> boom")


@lumos.remote
class Counter:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


@pytest.fixture(scope="module")
def workload(dash_cluster: lumos.LumosContext) -> dict[str, Any]:
    squares = [square.remote(i) for i in range(6)]
    summed = total.remote(*squares)
    nested = fan_out.remote(3)
    bad = explode.options(name=EVIL).remote()
    counter = Counter.remote()
    calls = [counter.add.remote(i) for i in range(4)]
    assert lumos.get(summed, timeout=60) == sum(i * i for i in range(6))
    assert lumos.get(nested, timeout=60) == 5
    assert lumos.get(calls, timeout=60)[-1] == 6
    with pytest.raises(ValueError):
        lumos.get(bad, timeout=60)
    return {"summed": summed, "counter": counter, "bad": bad}


def login(page: Any, ctx: lumos.LumosContext, target: str) -> None:
    page.goto(ctx.dashboard_url)
    assert page.url.endswith("/status"), page.url
    if target != "/status":
        page.goto(base_url(ctx.dashboard_url) + target)
    wait_doc(page, "(d, col) => d.get_model_by_name('root')")


def test_login_link_and_status_page(dash_cluster: lumos.LumosContext, workload: dict[str, Any], page: Any) -> None:
    assert dash_cluster.dashboard_url.startswith("http://127.0.0.1:")
    assert "/login?token=" in dash_cluster.dashboard_url
    login(page, dash_cluster, "/status")
    node_id = dash_cluster.address_info["node_id"]
    wait_doc(page, f"(d, col) => col('nodes_table', 'node').some(n => n.startsWith('{node_id[:8]}'))")
    assert column(page, "nodes_table", "state") == ["ALIVE"]
    assert column(page, "nodes_table", "labels") == ["zone=lab"]  # (ray.io/node-id left out)
    assert column(page, "nodes_table", "gpu")[0].endswith("/ 2")
    page.locator(".slick-cell", has_text=node_id[:8]).first.wait_for()
    assert "connected to" in page.locator(".lumos-header").first.inner_text()
    # Real memory use beside the reservation, and one bar per node.
    assert "(lumos " in column(page, "nodes_table", "memory_real")[0]
    assert column(page, "memory_bar", "node") == [column(page, "nodes_table", "node")[0]]
    assert 0 < column(page, "memory_bar", "memory")[0] <= 100
    # One worker count: the table's rows add up to the summary's.
    workers = int(page.locator(".lumos-workers").inner_text())
    assert workers == sum(column(page, "nodes_table", "workers")) and workers >= 1
    # History fills once a second.
    wait_doc(page, "(d, col) => col('history_memory', 'memory').length >= 3", 20)
    assert all(0 <= v <= 100 for v in column(page, "history_cpu", "cpu"))
    # Recent failures with their error line, shown as text.
    assert column(page, "failed_table", "name") == [EVIL]
    assert column(page, "failed_table", "error")[0] == "ValueError: <script>window.__pwned=2</script> boom"
    page.locator(".slick-cell", has_text="ValueError: <script>").first.wait_for()
    # Log tails: the raylet's, then a worker's; escaped.
    page.locator("pre.lumos-log", has_text="up:").wait_for()
    option = page.locator("select option", has_text="worker pid").first
    option.wait_for(state="attached")
    page.select_option("select", label=option.inner_text())
    page.locator(".lumos-log-name", has_text="worker-").wait_for()
    assert page.evaluate("() => window.__pwned") is None and page.locator("script", has_text="__pwned").count() == 0
    screenshot(page, "status")
    # The rendered table cell follows the count (idle workers come and go meanwhile: read
    # both at once, until a refresh has drawn the latest).
    def rendered_workers() -> tuple[str, str]:
        row = page.locator(".slick-row").first.inner_text().split("\n")
        return row[COLUMN_NAMES.index("workers")], page.locator(".lumos-workers").inner_text()
    wait_for(lambda: len(set(rendered_workers())) == 1, 10)
    assert not page.js_errors


@lumos.remote
def record_metrics(route: str) -> None:
    from lumos.util.metrics import Counter, Histogram
    Counter("pages_requests", tag_keys=("route",)).inc(2, tags={"route": route})
    Histogram("pages_latency_s", boundaries=[0.1, 1.0]).observe(0.5)


@lumos.remote
def conflict() -> None:
    from lumos.util.metrics import Counter
    Counter("pages_depth").inc()


def test_status_page_lists_application_metrics(dash_cluster: lumos.LumosContext, page: Any) -> None:
    """What tasks and the driver record shows as one row per metric and tag set, tag
    values escaped, within a couple of seconds and live after."""
    from lumos.util.metrics import Gauge
    lumos.get([record_metrics.remote("/a"), record_metrics.remote(EVIL)], timeout=60)
    gauge = Gauge("pages_depth")
    gauge.set(3)
    login(page, dash_cluster, "/status")
    wait_doc(page, "(d, col) => col('metrics_table', 'metric').includes('pages_latency_s')", 30)
    rows = dict(zip(zip(column(page, "metrics_table", "metric"), column(page, "metrics_table", "tags")),
                    column(page, "metrics_table", "value")))
    assert rows[("pages_requests", "route=/a")] == "2" and rows[("pages_requests", f"route={EVIL}")] == "2"
    assert rows[("pages_latency_s", "")] == "2 observed, mean 0.5, median <= 1, p99 <= 1"
    assert rows[("pages_depth", "")] == "3"
    page.locator(".slick-cell", has_text="route=<img").first.wait_for()  # shown as text
    assert page.evaluate("() => window.__pwned") is None
    assert "series" in page.locator(".lumos-metrics").inner_text()
    gauge.set(7)
    lumos.state.metrics()  # reported now
    wait_doc(page, "(d, col) => col('metrics_table', 'value')[col('metrics_table', 'metric')"
                   ".indexOf('pages_depth')] === '7'", 30)
    # Another process reports the name as another kind: refused by the GCS, and said so.
    lumos.get(conflict.remote(), timeout=60)
    page.locator(".lumos-metrics", has_text="refused, e.g. pages_depth").wait_for(timeout=30_000)
    page.locator(".lumos-metrics").scroll_into_view_if_needed()
    screenshot(page, "status_metrics")
    assert not page.js_errors


def test_task_stream_shows_executions_and_counts(dash_cluster: lumos.LumosContext, workload: dict[str, Any],
                                                 page: Any) -> None:
    login(page, dash_cluster, "/tasks")
    wait_doc(page, "(d, col) => col('done', 'name').includes('square')")
    names = column(page, "done", "name")
    assert {"square", "total", "fan_out", "Counter.add"} <= set(names), names
    page.locator(".lumos-count[data-state='FINISHED']").wait_for()
    assert "FAILED" in page.locator(".lumos-count[data-state='FAILED']").inner_text()
    # Bars take the task graph's state colours, explained by the same legend.
    colors = dict(zip(column(page, "done", "name"), column(page, "done", "color")))
    assert colors["square"] == STATE_COLORS["finished"] and colors[EVIL] == STATE_COLORS["failed"]
    legend = page.locator(".lumos-graph-legend").inner_text()
    assert all(state in legend for state in STATE_COLORS)
    screenshot(page, "task_stream")
    assert not page.js_errors


def test_task_graph_draws_three_edge_kinds_and_details(dash_cluster: lumos.LumosContext,
                                                       workload: dict[str, Any], page: Any) -> None:
    login(page, dash_cluster, "/graph")
    wait_doc(page, "(d, col) => col('edges_stateful', 'x0').length >= 3")
    kinds = column(page, "nodes", "kind")
    names = column(page, "nodes", "name")
    assert kinds.count("task") >= 6 + 1 + 1 + 3 + 1 + 5 and "object" in kinds
    assert len(column(page, "edges_data", "x0")) >= 12      # 6 squares -> objects -> total
    assert len(column(page, "edges_control", "x0")) >= 3    # fan_out -> its 3 squares
    assert len(column(page, "edges_stateful", "x0")) >= 3   # 4 Counter.add calls in a chain
    # Colour by state: the failed task is red, finished ones green.
    colors = dict(zip(names, column(page, "nodes", "color")))
    assert colors[EVIL] == "#d7191c" and colors["total"] == "#1a9641"
    # "Click" the failed node (select it in the browser's document; the server answers with details).
    index = names.index(EVIL)
    page.evaluate("i => { const r = Bokeh.documents[0].get_model_by_name('nodes'); r.data_source.selected.indices = [i]; }",
                  index)
    details = page.locator(".lumos-details")
    details.wait_for()
    text = details.inner_text()
    assert f"task {EVIL}" in text and "state\tFAILED" in text and "\nerror\t" in text
    # Every value is escaped: the text shows, nothing of it runs or becomes an element.
    assert page.evaluate("() => window.__pwned") is None
    assert page.locator("img[src='x']").count() == 0
    screenshot(page, "task_graph")
    assert not page.js_errors


def test_lineage_of_one_object(dash_cluster: lumos.LumosContext, workload: dict[str, Any], page: Any) -> None:
    summed = workload["summed"]
    login(page, dash_cluster, f"/lineage?object={summed.hex()}")
    wait_doc(page, "(d, col) => col('nodes', 'name').includes('total')")
    names = column(page, "nodes", "name")
    assert names.count("square") == 6 and names.count("total") == 1
    assert "fan_out" not in names and "Counter.add" not in names
    assert "7 task(s) in its lineage" in page.locator(".lumos-lineage-info").inner_text()  # 6 square + total
    # The legend says nothing about counts (it said "0 tasks" above "7 task(s) in its lineage").
    assert "tasks" not in page.locator(".lumos-graph-legend").inner_text()
    screenshot(page, "lineage")
    assert not page.js_errors


def test_lineage_found_by_task_name_or_from_the_graph(dash_cluster: lumos.LumosContext,
                                                      workload: dict[str, Any], page: Any) -> None:
    six_squares = "(d, col) => col('nodes', 'name').filter(n => n === 'square').length === 6"
    login(page, dash_cluster, "/lineage")
    box = page.locator("input.bk-input").first
    box.fill("tota")
    box.press("Enter")
    page.locator(".slick-cell", has_text="total").first.click()
    wait_doc(page, six_squares)
    assert "7 task(s) in its lineage" in page.locator(".lumos-lineage-info").inner_text()
    screenshot(page, "lineage_search")
    # From the task graph: a task's details link to the lineage of its result.
    login(page, dash_cluster, "/graph")
    wait_doc(page, "(d, col) => col('nodes', 'name').includes('total')")
    index = column(page, "nodes", "name").index("total")
    page.evaluate("i => { const r = Bokeh.documents[0].get_model_by_name('nodes'); r.data_source.selected.indices = [i]; }",
                  index)
    page.locator("a.lumos-lineage-link").click()
    page.wait_for_url("**/lineage?object=*")
    wait_doc(page, six_squares)
    assert not page.js_errors


def test_actors_page(dash_cluster: lumos.LumosContext, workload: dict[str, Any], page: Any) -> None:
    login(page, dash_cluster, "/actors")
    wait_doc(page, "(d, col) => col('actors_table', 'class_name').length > 0")
    assert "Counter" in column(page, "actors_table", "class_name")
    assert column(page, "actors_table", "state") == ["ALIVE"]
    assert column(page, "actors_table", "pid")[0]
    screenshot(page, "actors")
    assert not page.js_errors


def test_gpus_page_shows_the_holder(dash_cluster: lumos.LumosContext, workload: dict[str, Any], page: Any) -> None:
    held = gpu_hold.remote(20.0)
    login(page, dash_cluster, "/gpus")
    wait_doc(page, "(d, col) => col('gpus_table', 'holder').includes('gpu_hold')", 40)
    kinds = column(page, "gpus_table", "holder_kind")
    assert kinds.count("task") == 1
    screenshot(page, "gpus")
    assert len(lumos.get(held, timeout=60)) == 1
    # Released: the holder disappears live.
    wait_doc(page, "(d, col) => !col('gpus_table', 'holder').includes('gpu_hold')", 40)
    assert not page.js_errors


def test_gpus_page_shows_a_placement_group_bundle(dash_cluster: lumos.LumosContext, workload: dict[str, Any],
                                                  page: Any) -> None:
    pg = lumos.util.placement_group([{"GPU": 1}], name="gpu-pg")
    try:
        assert pg.wait(30)
        gpu = lumos.util.placement_group_table(pg)["bundles_to_gpu_ids"][0][0]
        login(page, dash_cluster, "/gpus")
        row = wait_doc(page, "(d, col) => { const k = col('gpus_table', 'holder_kind'); const i = k.indexOf('bundle');"
                             " return i >= 0 && col('gpus_table', 'gpu')[i] !== '?' ? i + 1 : 0; }", 40) - 1
        assert column(page, "gpus_table", "gpu")[row] == str(gpu)
        assert column(page, "gpus_table", "holder")[row] == f"pg {pg.id.hex()[:8]} (gpu-pg) bundle 0"
        assert pg.id.hex().startswith(column(page, "gpus_table", "holder_id")[row])
        assert column(page, "gpus_table", "amount")[row] == "1"
        # The reserved GPU is not listed as free.
        free = [g for g, k in zip(column(page, "gpus_table", "gpu"), column(page, "gpus_table", "holder_kind"))
                if k == "free"]
        assert str(gpu) not in free and len(free) == 1, free
        screenshot(page, "gpus_bundle")
    finally:
        lumos.util.remove_placement_group(pg)
    # Removed: the bundle's row disappears live and its GPU is free again.
    wait_doc(page, "(d, col) => !col('gpus_table', 'holder_kind').includes('bundle')"
                   " && col('gpus_table', 'holder_kind').filter(k => k === 'free').length === 2", 40)
    assert not page.js_errors


def test_pages_are_live_within_one_second(dash_cluster: lumos.LumosContext, workload: dict[str, Any],
                                          page: Any) -> None:
    login(page, dash_cluster, "/graph")
    wait_doc(page, "(d, col) => col('nodes', 'name').includes('total')")
    lags = []
    for i in range(3):
        ref = square.options(name=f"live_{i}").remote(i)
        t0 = time.monotonic()
        lumos.get(ref, timeout=30)
        wait_doc(page, f"(d, col) => col('nodes', 'name').includes('live_{i}')", 10)
        lags.append(time.monotonic() - t0)
    # Measured 0.3-0.8 s: event flush (0.1 s) + poll (0.25 s) + refresh (0.25 s) + websocket.
    assert max(lags) <= 1.5, lags
    print("dashboard lag (s):", [round(x, 2) for x in lags])
