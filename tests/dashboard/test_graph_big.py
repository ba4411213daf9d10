"""A 479-task reduction tree on the task graph page: grouped by function before it
smears, expandable to every task, the plot as tall as its rows and fitted to them."""

from __future__ import annotations

import time
from typing import Any

import pytest

import lumos
from lumos.dashboard.components.task_graph import MAX_HEIGHT
from tests.dashboard.conftest import column, screenshot, wait_doc
from tests.dashboard.test_pages import login

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(240)]

LEAVES = 240  # + 239 combines = 479 tasks


@lumos.remote
def leaf(i: int) -> int:
    return i


@lumos.remote
def combine(a: int, b: int) -> int:
    return a + b


def _tree() -> Any:
    layer = [leaf.remote(i) for i in range(LEAVES)]
    while len(layer) > 1:
        nxt = [combine.remote(layer[i], layer[i + 1]) for i in range(0, len(layer) - 1, 2)]
        layer = nxt + ([layer[-1]] if len(layer) % 2 else [])
    return layer[0]


def _plot(page: Any) -> dict[str, Any]:
    return page.evaluate("() => { const d = Bokeh.documents[0]; const p = d.get_model_by_name('task_graph');"
                         " return {height: p.height, x0: p.x_range.start, x1: p.x_range.end,"
                         " y0: p.y_range.start, y1: p.y_range.end,"
                         " labels: d.get_model_by_name('labels').visible}; }")


def test_a_479_task_tree_is_readable(dash_cluster: lumos.LumosContext, page: Any) -> None:
    t0 = time.monotonic()
    assert lumos.get(_tree(), timeout=120) == sum(range(LEAVES))
    print(f"479 tasks in {time.monotonic() - t0:.1f}s")
    login(page, dash_cluster, "/graph")
    # Auto: one node per function (240 leaves side by side would be a smear).
    wait_doc(page, "(d, col) => col('nodes', 'kind').includes('group')"
                   " && col('nodes', 'label').some(l => l.startsWith('combine ×239'))", 60)
    labels = column(page, "nodes", "label")
    assert "leaf ×240" in labels and len(labels) == 2
    box = _plot(page)
    xs, ys = column(page, "nodes", "x"), column(page, "nodes", "y")
    # Fitted: every node inside the ranges, with room right of the last column for its label.
    assert box["x0"] < min(xs) and box["x1"] >= max(xs) + 1 and box["y0"] < min(ys) and box["y1"] > max(ys)
    assert box["height"] < 400 and box["labels"]
    screenshot(page, "graph_479_grouped")
    # Each task: 479 tasks, the plot grows with the rows up to its maximum, labels hidden.
    page.locator("button", has_text="each task").click()
    wait_doc(page, "(d, col) => col('nodes', 'kind').filter(k => k === 'task').length === 479", 60)
    box = _plot(page)
    ys = column(page, "nodes", "y")
    assert box["height"] == MAX_HEIGHT and not box["labels"]
    assert box["y0"] < min(ys) and box["y1"] > max(ys)
    screenshot(page, "graph_479_tasks")
    # And back.
    page.locator("button", has_text="by function").click()
    wait_doc(page, "(d, col) => col('nodes', 'kind').filter(k => k === 'group').length === 2", 30)
    assert not page.js_errors
