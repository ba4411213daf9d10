"""The dashboard through a real jupyter-server with the ``lumos.dashboard`` extension,
and embedded in a notebook executed by nbclient."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import nbformat
import pytest
import websocket
from nbclient import NotebookClient

import lumos
from lumos.dashboard.components.common import PAGE_TITLES
from tests.conftest import wait_for
from tests.dashboard.conftest import screenshot, wait_doc

BASE = "/user/ci/"
TOKEN = "lumos-test-jupyter-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class JupyterServer:
    """A jupyter-server subprocess (base_url /user/ci/, like JupyterHub and Binder)."""

    def __init__(self, root: Any, extension: bool) -> None:
        self.root = root
        self.runtime_dir = str(root / "runtime")
        env = dict(os.environ, JUPYTER_CONFIG_DIR=str(root / "config"), JUPYTER_RUNTIME_DIR=self.runtime_dir,
                   JUPYTER_DATA_DIR=str(root / "data"))
        port = _free_port()
        cmd = [sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
               f"--ServerApp.base_url={BASE}", f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={root}",
               f"--ServerApp.jpserver_extensions={{'lumos.dashboard': {extension}}}"]
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self._log = open(root / "server.log", "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(root))
        self.url = f"http://127.0.0.1:{port}"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}{BASE}api/status?token={TOKEN}", timeout=5) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError("jupyter-server did not start: " + self.log()[-2000:])
            time.sleep(0.2)

    def log(self) -> str:
        return (self.root / "server.log").read_text()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self._log.close()


@contextlib.contextmanager
def jupyter_server(root: Any, extension: bool) -> Iterator[JupyterServer]:
    server = JupyterServer(root, extension)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def jupyter_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterServer]:
    """A jupyter-server with the extension enabled."""
    with jupyter_server(tmp_path_factory.mktemp("jupyter"), True) as server:
        yield server
    text = server.log()
    assert "lumos dashboard mounted at" in text, text[-3000:]


@pytest.fixture(scope="module")
def jupyter(jupyter_app: JupyterServer) -> str:
    return jupyter_app.url


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


@pytest.mark.timeout(120)
def test_metrics_through_the_jupyter_server_need_its_login(jupyter: str, dash_cluster: lumos.LumosContext) -> None:
    """``{base}lumos/metrics?cluster=`` serves the cluster's Prometheus text to a scraper
    with the Jupyter token (header or query), and 403 (not the login page) without it."""
    from prometheus_client.parser import text_string_to_metric_families

    from lumos.util.metrics import Counter
    Counter("jupyter_scraped", description="Counted by the test driver.").inc(3)
    lumos.state.metrics()  # reported
    url = f"{jupyter}{BASE}lumos/metrics?cluster={_cluster(dash_cluster)}"
    assert _status(url) == (403, "")
    assert _status(url + "&token=nope") == (403, "")
    assert _status(f"{jupyter}{BASE}lumos/metrics?cluster=..%2Fetc&token={TOKEN}")[0] == 400
    assert _status(f"{jupyter}{BASE}lumos/metrics?cluster=session_gone&token={TOKEN}")[0] == 404
    for request in (urllib.request.Request(url, headers={"Authorization": f"token {TOKEN}"}),
                    urllib.request.Request(f"{url}&token={TOKEN}")):
        with urllib.request.urlopen(request, timeout=30) as r:
            body, content_type = r.read().decode(), r.headers["Content-Type"]
        assert content_type.startswith("text/plain; version=0.0.4")
        found = {(s.name, tuple(s.labels.items())): s.value
                 for f in text_string_to_metric_families(body) for s in f.samples}
        assert found[("jupyter_scraped_total", ())] == 3.0
        assert found[("lumos_nodes", (("state", "ALIVE"),))] == 1


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


@pytest.mark.timeout(120)
def test_kernel_links_through_jupyter_only_when_the_extension_is_loaded(
        jupyter_app: JupyterServer, dash_cluster: lumos.LumosContext, tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from lumos.dashboard import notebook
    for var in ("LUMOS_DASHBOARD_URL", "JUPYTERHUB_SERVICE_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    # A kernel launched by the server with the extension: the page goes through Jupyter.
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", jupyter_app.runtime_dir)
    monkeypatch.setenv("JPY_PARENT_PID", str(jupyter_app.proc.pid))
    frame = notebook.show("status")
    assert frame.note == "" and frame.url.startswith(f"{BASE}lumos/dashboard/status?cluster=session_")
    code, location = _status(f"{jupyter_app.url}{frame.url}&token={TOKEN}")
    assert code == 302 and f"{BASE}lumos/bokeh/status?" in location
    # A server without it (an editable install before the fix, or another environment):
    # the head node's own URL, and one line saying how to enable the extension.
    with jupyter_server(tmp_path, False) as bare:
        monkeypatch.setenv("JUPYTER_RUNTIME_DIR", bare.runtime_dir)
        monkeypatch.setenv("JPY_PARENT_PID", str(bare.proc.pid))
        assert _status(f"{bare.url}{BASE}lumos/dashboard/status?token={TOKEN}")[0] == 404
        frame = notebook.show("graph")
        assert frame.url.startswith("http://127.0.0.1:") and "page=graph" in frame.url
        assert frame.note == notebook.EXTENSION_MISSING and "jpserver_extensions" in frame.note
        html = frame._repr_html_()
        assert html.index("lumos-dashboard-note") < html.index("<iframe")
        assert notebook.EXTENSION_MISSING.splitlines() == [notebook.EXTENSION_MISSING]
        opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
        with opener.open(frame.url, timeout=20) as r:  # the fallback really serves the page
            assert r.status == 200


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_editable_install_enables_the_server_extension(tmp_path: Any) -> None:
    """``pip install -e .`` installs the jupyter_server_config.d file, so a plain
    ``jupyter server extension list`` shows lumos.dashboard enabled."""
    repo = Path(__file__).resolve().parents[2]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--no-deps", "-e", str(repo)], check=True, timeout=240, cwd=str(tmp_path))
    config = venv / "etc" / "jupyter" / "jupyter_server_config.d" / "lumos.dashboard.json"
    assert json.loads(config.read_text())["ServerApp"]["jpserver_extensions"] == {"lumos.dashboard": True}
    # The server of the test environment reads that file as it would its own prefix's.
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(venv / "etc" / "jupyter"), JUPYTER_CONFIG_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "jupyter", "server", "extension", "list"], env=env,
                         capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    text = re.sub(r"\x1b\[[0-9;]*m", "", out.stdout + out.stderr)
    assert re.search(r"lumos\.dashboard\s+enabled", text), text
    assert re.search(r"lumos\.dashboard\s+OK", text), text


@pytest.mark.timeout(120)
def test_jupyter_page_links_expire_and_forbid_framing(jupyter_app: JupyterServer,
                                                      dash_cluster: lumos.LumosContext) -> None:
    from lumos.dashboard import auth
    name = _cluster(dash_cluster)
    code, location = _status(f"{jupyter_app.url}{BASE}lumos/dashboard/status?cluster={name}&token={TOKEN}")
    assert code == 302
    sid = re.search(r"bokeh-session-id=([^&]+)", location).group(1)
    base, sig = sid.split(".", 1)
    expiry = int(base.rsplit("x", 1)[1], 16)
    assert time.time() < expiry <= time.time() + auth.SESSION_ID_TTL_S + 1
    page = f"{jupyter_app.url}{location}"
    with urllib.request.urlopen(page, timeout=20) as r:
        assert r.status == 200
        assert r.headers["Content-Security-Policy"] == "frame-ancestors 'self'"
    # A later expiry under the old signature (a copied link made to last) is refused.
    later = base.rsplit("x", 1)[0] + f"x{expiry + 86400:x}"
    assert _status(page.replace(sid, f"{later}.{sig}"))[0] == 403
    assert _status(f"{jupyter_app.url}{BASE}lumos/bokeh/status?cluster={name}")[0] == 403
    # Neither the session id nor Jupyter's token reaches the server's log.
    text = wait_for(lambda: (lambda t: t if f"GET {BASE}lumos/bokeh/status " in t else "")(jupyter_app.log()))
    assert sid not in text and base not in text
