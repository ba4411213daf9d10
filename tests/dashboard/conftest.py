"""Fixtures of the dashboard tests: a cluster with its dashboard, a logged-in headless
Chromium (Debian's, driven by Playwright), and helpers to read the Bokeh document."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any, Iterator

import psutil
import pytest

import lumos
from tests.conftest import check_no_leaks, start

ARTIFACTS = os.path.join(os.path.dirname(__file__), "..", "..", "test-artifacts", "dashboard")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


def dashboard_children() -> list[psutil.Process]:
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "-m lumos.dashboard" in " ".join(p.cmdline()):
                out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def base_url(login_url: str) -> str:
    return login_url.split("/login", 1)[0]


@pytest.fixture(scope="module")
def dash_cluster() -> Iterator[lumos.LumosContext]:
    """A 2-CPU cluster with 2 declared GPUs, a node label, and its dashboard."""
    ctx = start(num_gpus=2, object_store_memory=256 * 1024 * 1024, include_dashboard=True, labels={"zone": "lab"})
    session = ctx.address_info["session_dir"]
    try:
        yield ctx
    finally:
        lumos.shutdown()
        check_no_leaks(session)
        assert not dashboard_children(), "the dashboard outlived shutdown()"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """A headless Debian Chromium (never ``playwright install``)."""
    from playwright.sync_api import sync_playwright
    pw = sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu", "--disable-quic"],
                               timeout=60_000)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.js_errors = errors
    try:
        yield pg
    finally:
        context.close()


def screenshot(pg: Any, name: str) -> str:
    os.makedirs(ARTIFACTS, exist_ok=True)
    path = os.path.join(ARTIFACTS, f"{name}.png")
    pg.screenshot(path=path, full_page=True)
    return path


_COL_JS = ("const col = (name, field) => { const m = B.documents[0].get_model_by_name(name);"
           " if (!m) return []; const src = m.data_source || m.source; const data = src.data;"
           " const c = data instanceof Map ? data.get(field) : data[field]; return Array.from(c || []); };")


def wait_doc(pg: Any, js_predicate: str, timeout_s: float = 30.0) -> Any:
    """Wait until ``js_predicate(doc, col)`` is truthy: a JS arrow function of the Bokeh
    document and ``col(model_name, field)``, which reads a column of a named renderer's
    or table's data source."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = pg.evaluate(f"() => {{ const B = window.Bokeh; if (!B || !B.documents.length) return null; {_COL_JS}"
                           f" return ({js_predicate})(B.documents[0], col); }}")
        if last:
            return last
        pg.wait_for_timeout(100)
    raise AssertionError(f"Bokeh document never satisfied {js_predicate!r} (last value {last!r})")


def column(pg: Any, model_name: str, field: str) -> list[Any]:
    """A column of the data source of the renderer or table named ``model_name``."""
    return pg.evaluate("([name, field]) => { const B = window.Bokeh; " + _COL_JS + " return col(name, field); }",
                       [model_name, field])
