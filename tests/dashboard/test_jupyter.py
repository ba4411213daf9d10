"""The dashboard through a real jupyter-server with the ``lumos.dashboard`` extension,
and embedded in a notebook executed by nbclient."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any, Iterator

import nbformat
import pytest
import websocket
from nbclient import NotebookClient

import lumos
from lumos.dashboard.components.common import PAGE_TITLES
from tests.dashboard.conftest import screenshot, wait_doc

BASE = "/user/ci/"
TOKEN = "lumos-test-jupyter-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A jupyter-server (base_url /user/ci/, like JupyterHub and Binder) with the extension enabled."""
    root = tmp_path_factory.mktemp("jupyter")
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(root / "config"), JUPYTER_RUNTIME_DIR=str(root / "runtime"),
               JUPYTER_DATA_DIR=str(root / "data"))
    port = _free_port()
    cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--ServerApp.base_url={BASE}", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
           "--ServerApp.jpserver_extensions={'lumos.dashboard': True}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(root))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}{BASE}api/status?token={TOKEN}", timeout=5) as r:
                    if r.status == 200:
                        break
            except (OSError, urllib.error.URLError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("jupyter-server did not start: " + (root / "server.log").read_text()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        text = (root / "server.log").read_text()
        assert "lumos dashboard mounted at" in text, text[-3000:]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.build_opener(_NoRedirect).open(url, timeout=20) as r:
            return r.status, r.headers.get("Location", "")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Location", "")


def _cluster(ctx: lumos.LumosContext) -> str:
    return os.path.basename(ctx.address_info["session_dir"])


@lumos.remote
def inc(x: int) -> int:
    return x + 1


@pytest.mark.browser
@pytest.mark.timeout(180)
def test_every_page_through_the_jupyter_server(jupyter: str, dash_cluster: lumos.LumosContext, page: Any) -> None:
    ref = inc.remote(inc.remote(1))
    assert lumos.get(ref, timeout=60) == 3
    name = _cluster(dash_cluster)
    for p in PAGE_TITLES:
        extra = f"&object={ref.hex()}" if p == "lineage" else ""
        page.goto(f"{jupyter}{BASE}lumos/dashboard/{p}?cluster={name}&token={TOKEN}{extra}")
        assert f"{BASE}lumos/bokeh/{p}?" in page.url and "bokeh-session-id=" in page.url
        wait_doc(page, "(d, col) => d.get_model_by_name('root')")
        page.locator(".lumos-header", has_text="connected to").wait_for()
        if p == "status":
            wait_doc(page, "(d, col) => col('nodes_table', 'state').includes('ALIVE')")
        elif p in ("graph", "lineage"):
            wait_doc(page, "(d, col) => col('nodes', 'name').includes('inc')")
        elif p == "tasks":
            wait_doc(page, "(d, col) => col('done', 'name').includes('inc')")
        # Navigation stays inside the Jupyter server (through the authenticated launcher).
        hrefs = page.eval_on_selector_all("a.lumos-nav", "els => els.map(e => e.getAttribute('href'))")
        assert hrefs and all(h.startswith(f"{BASE}lumos/dashboard/") and f"cluster={name}" in h for h in hrefs)
        screenshot(page, f"jupyter_{p}")
    assert not page.js_errors


@pytest.mark.timeout(120)
def test_jupyter_login_required_and_bokeh_refuses_unsigned(jupyter: str, dash_cluster: lumos.LumosContext) -> None:
    name = _cluster(dash_cluster)
    # No Jupyter login: the launcher sends to Jupyter's login page.
    code, location = _status(f"{jupyter}{BASE}lumos/dashboard/status?cluster={name}")
    assert code in (302, 403) and (code == 403 or "login" in location)
    # The Bokeh pages themselves need a session id signed by the extension.
    assert _status(f"{jupyter}{BASE}lumos/bokeh/status?cluster={name}")[0] == 403
    assert _status(f"{jupyter}{BASE}lumos/bokeh/status?cluster={name}&bokeh-session-id=forged")[0] == 403
    # The cluster comes from a session name, never a path or an address.
    assert _status(f"{jupyter}{BASE}lumos/dashboard/status?cluster=..%2F..%2Fetc&token={TOKEN}")[0] == 400
    assert _status(f"{jupyter}{BASE}lumos/dashboard/status?cluster=127.0.0.1:6379&token={TOKEN}")[0] == 400
    assert _status(f"{jupyter}{BASE}lumos/dashboard/status?cluster=session_gone&token={TOKEN}")[0] == 404
    assert _status(f"{jupyter}{BASE}lumos/dashboard/nope?cluster={name}&token={TOKEN}")[0] == 404
    # With the login, a signed page; its websocket is refused from a foreign Origin.
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    with opener.open(f"{jupyter}{BASE}lumos/dashboard/status?cluster={name}&token={TOKEN}", timeout=20) as r:
        body = r.read().decode()
    token = (re.search(r'"token":\s*"([^"]+)"', body) or re.search(r"token&quot;:&quot;([^&]+)&quot;", body))
    assert token
    ws_url = jupyter.replace("http://", "ws://") + f"{BASE}lumos/bokeh/status/ws"
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(ws_url, origin="http://evil.example", subprotocols=["bokeh", token.group(1)],
                                    timeout=10)
    assert e.value.status_code == 403
    ws = websocket.create_connection(ws_url, origin=jupyter, subprotocols=["bokeh", token.group(1)], timeout=10)
    try:
        assert ws.recv()
    finally:
        ws.close()


NOTEBOOK_CELLS = [
    """import os, time, lumos, lumos.dashboard
ctx = lumos.init(num_cpus=1, object_store_memory=64 * 1024 * 1024, include_dashboard=True)

@lumos.remote
def inc(x):
    return x + 1

ref = inc.remote(inc.remote(1))
print(lumos.get(ref, timeout=60))""",
    """lumos.dashboard.show("graph")""",
    """os.environ["LUMOS_DASHBOARD_URL"] = "/user/ci/"
print(lumos.dashboard.dashboard_url("lineage", object=ref))
del os.environ["LUMOS_DASHBOARD_URL"]""",
    """w = lumos.dashboard.graph(ref)
w""",
    """deadline = time.time() + 20
nodes = w._model.select_one({"name": "nodes"}).data_source
while time.time() < deadline and "inc" not in list(nodes.data["name"]):
    time.sleep(0.2)
print("lineage nodes:", sorted(set(nodes.data["name"])))""",
    """lumos.shutdown()""",
]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_notebook_embeds_the_dashboard(tmp_path: Any) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK_CELLS]
    NotebookClient(nb, kernel_name="python3", timeout=180, store_widget_state=True,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [cell.outputs for cell in nb.cells]
    assert outputs[0][0]["text"].strip() == "3"
    iframe = outputs[1][0]["data"]["text/html"]
    assert "<iframe" in iframe and "/login?token=" in iframe and "page=graph" in iframe
    src = re.search(r'src="([^"]+)"', iframe).group(1).replace("&amp;", "&")
    assert src.startswith("http://127.0.0.1:")
    via_jupyter = outputs[2][0]["text"].strip()
    assert re.fullmatch(r"/user/ci/lumos/dashboard/lineage\?cluster=session_[\w-]+&object=[0-9a-f]+", via_jupyter)
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs[3])
    assert "lineage nodes: ['inc', 'return 0 of inc']" in outputs[4][0]["text"]
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "BokehModel" for m in state.values())
