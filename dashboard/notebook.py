"""The dashboard in notebook cells: ``show(page)`` (a live page in an IFrame) and
``graph(ref)`` (the task graph, or one object's lineage, as a live ``jupyter_bokeh``
widget). Called by ``%lumos dashboard [PAGE]`` and ``%lumos graph [REF]``.

Where the page comes from: through the jupyter-server extension when the kernel runs
under a Jupyter server (the only port a Binder or remote JupyterLab user can reach),
else the head node's own dashboard URL. The kernel learns the browser-side base URL
from, in order: ``LUMOS_DASHBOARD_URL``, ``JUPYTERHUB_SERVICE_PREFIX``, the
``jpserver-<pid>.json`` of the server that launched it (``JPY_PARENT_PID``). When that
server did not load the extension (no ``lumos-dashboard-<pid>.json`` beside it), the
cell shows the head node's URL with one line saying how to enable it.

``graph`` polls the GCS from a background thread (``lumos-dashboard``) with its own
loop; the notebook's thread and loop never wait on it.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from typing import Any
from urllib.parse import urlencode

from lumos.dashboard.components.common import PAGE_TITLES


def _context() -> Any:
    from lumos.util.session import current
    ctx = current()
    if ctx is None or not getattr(ctx, "address_info", None):
        raise RuntimeError("no lumos cluster in this kernel: call lumos.init() first")
    return ctx


def _server_info() -> tuple[str, str] | None:
    """(base URL, runtime dir) of the Jupyter server that launched this kernel, if any."""
    parent = os.environ.get("JPY_PARENT_PID")
    if not parent or not parent.isdigit():
        return None
    try:
        from jupyter_core.paths import jupyter_runtime_dir
        runtime = jupyter_runtime_dir()
        with open(os.path.join(runtime, f"jpserver-{parent}.json")) as f:
            base = str(json.load(f).get("base_url") or "/")
    except (OSError, ValueError, ImportError):
        return None
    return (base if base.endswith("/") else base + "/"), runtime


def jupyter_base_url() -> str | None:
    """The Jupyter server's base URL as the browser sees it, or None outside a Jupyter server."""
    explicit = os.environ.get("LUMOS_DASHBOARD_URL")
    if explicit:
        return explicit if explicit.endswith("/") else explicit + "/"
    hub = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if hub:
        return hub if hub.endswith("/") else hub + "/"
    info = _server_info()
    return info[0] if info else None


#: Shown above the embedded page when the Jupyter server does not serve the dashboard.
EXTENSION_MISSING = ("This Jupyter server does not load the lumos.dashboard extension, so this is the head "
                     "node's own dashboard (reachable only from a browser that can reach the cluster). To serve "
                     "it through Jupyter, install lumos in the server's environment (pip install -e . or "
                     "pip install .) and restart Jupyter, or start it with "
                     "--ServerApp.jpserver_extensions=\"{'lumos.dashboard': True}\".")


def extension_serving() -> bool:
    """False when the Jupyter server that launched this kernel is known not to serve
    ``{base_url}lumos/`` (it wrote no ``lumos-dashboard-<pid>.json``)."""
    if os.environ.get("LUMOS_DASHBOARD_URL"):
        return True  # the user says where it is
    info = _server_info()
    if info is None:
        return True  # unknown (a Hub prefix without the server's files): trust the prefix
    from lumos.dashboard.server_ext import marker_path
    return os.path.exists(marker_path(info[1], int(os.environ["JPY_PARENT_PID"])))


def _check_page(page: str) -> None:
    if page not in PAGE_TITLES:
        raise ValueError(f"unknown dashboard page {page!r}; pages: {', '.join(PAGE_TITLES)}")


def _object_hex(ref: Any) -> str | None:
    if ref is None:
        return None
    if hasattr(ref, "hex"):
        return str(ref.hex())
    if isinstance(ref, str) and ref.isalnum():
        return ref.lower()
    raise TypeError(f"expected an ObjectRef or an object id in hex, got {type(ref).__name__}")


def _resolve(page: str, object: Any, via_jupyter: bool | None) -> tuple[str, str]:
    """(URL, note): the note says why the URL is not the Jupyter server's ("" when it is)."""
    _check_page(page)
    ctx = _context()
    obj = _object_hex(object)
    base = jupyter_base_url() if via_jupyter in (None, True) else None
    if via_jupyter and base is None:
        raise RuntimeError("this kernel does not run under a Jupyter server")
    note = ""
    if base is not None and via_jupyter is None and not extension_serving():
        base, note = None, EXTENSION_MISSING
    if base is not None:
        args = {"cluster": os.path.basename(ctx.address_info["session_dir"].rstrip("/"))}
        if obj:
            args["object"] = obj
        return f"{base}lumos/dashboard/{page}?{urlencode(args)}", note
    if not ctx.dashboard_url:
        raise RuntimeError("this cluster runs without a dashboard (include_dashboard=False)")
    args = {"page": page}
    if obj:
        args["object"] = obj
    return f"{ctx.dashboard_url}&{urlencode(args)}", note


def dashboard_url(page: str = "status", *, object: Any = None, via_jupyter: bool | None = None) -> str:
    """The URL of a dashboard page of this kernel's cluster.

    Args:
        page: one of status, tasks, graph, lineage, actors, gpus.
        object: for ``lineage``, an ObjectRef or its hex id.
        via_jupyter: force (True) or avoid (False) the jupyter-server extension; by
            default used whenever the kernel runs under a Jupyter server that loaded it.

    Raises:
        ValueError: unknown page; RuntimeError: no cluster (or no dashboard) here.
    """
    return _resolve(page, object, via_jupyter)[0]


class DashboardFrame:
    """A live page in an IFrame, with a one-line note above it when there is one."""

    def __init__(self, url: str, height: int, note: str = "") -> None:
        from IPython.display import IFrame
        self.url = url
        self.note = note
        self._frame = IFrame(url, width="100%", height=height)

    def _repr_html_(self) -> str:
        import html
        note = (f"<div class='lumos-dashboard-note' style='font-size:12px;color:#8a6d3b'>{html.escape(self.note)}"
                "</div>") if self.note else ""
        return note + self._frame._repr_html_()

    def __repr__(self) -> str:
        return (f"{self.note}\n" if self.note else "") + f"lumos dashboard: {self.url}"


def show(page: str = "status", *, object: Any = None, height: int = 620, via_jupyter: bool | None = None) -> Any:
    """Embed a live dashboard page in the cell output (an IFrame, with a note above it
    when the Jupyter server does not serve the dashboard).

    Example:
        >>> lumos.dashboard.show("graph")
    """
    url, note = _resolve(page, object, via_jupyter)
    return DashboardFrame(url, height, note)


# --------------------------------------------------------------------------------- live widget


class _Poller:
    """A ClusterSource on its own loop in the ``lumos-dashboard`` thread (one per kernel)."""

    def __init__(self, session_dir: str, gcs_address: str) -> None:
        from lumos.dashboard.source import ClusterSource
        from lumos.state import StateClient
        from lumos.util.session import read_token
        sock = os.path.join(session_dir, "sockets", "gcs.sock")
        address = sock if os.path.exists(sock) else gcs_address
        client = StateClient(address, read_token(os.path.join(session_dir, "token")), name="notebook-graph->gcs")
        self.session_dir = session_dir
        self.loop = asyncio.new_event_loop()
        self.source = ClusterSource(client, label=os.path.basename(session_dir))
        self.pages: list[Any] = []
        self.thread = threading.Thread(target=self._run, name="lumos-dashboard", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        import logging
        log = logging.getLogger(__name__)
        while True:
            if self.pages:
                self.source.touch()
            for page in list(self.pages):
                if page.seen != self.source.tick:
                    tick = self.source.tick
                    try:
                        page.update()
                    except Exception:
                        log.exception("updating a notebook graph failed")
                    page.seen = tick
            # Every document change costs the widget comm several messages: stay at 2 Hz.
            await asyncio.sleep(0.5)

    def add(self, page: Any) -> None:
        self.loop.call_soon_threadsafe(self.pages.append, page)


_poller: _Poller | None = None
_poller_lock = threading.Lock()


def _get_poller() -> _Poller:
    global _poller
    ctx = _context()
    session_dir = ctx.address_info["session_dir"]
    with _poller_lock:
        if _poller is None or _poller.session_dir != session_dir:
            _poller = _Poller(session_dir, ctx.address_info.get("gcs_address", ""))
        return _poller


def graph(ref: Any = None, *, group_threshold: int = 500) -> Any:
    """A live task-graph widget (or, given a ref, that object's lineage) for a cell.

    Returns a ``jupyter_bokeh.BokehModel``; display it (the last expression of a cell).

    Example:
        >>> lumos.dashboard.graph(ref)
    """
    from bokeh.io import output_notebook
    from bokeh.layouts import column
    from bokeh.resources import INLINE
    from jupyter_bokeh import BokehModel

    from lumos.dashboard.components.lineage import LineagePage
    from lumos.dashboard.components.task_graph import TaskGraphPage
    obj = _object_hex(ref)
    poller = _get_poller()

    def links(page: str, args: dict[str, str]) -> str:
        return ""

    if obj:
        page: Any = LineagePage(poller.source, {"object": obj}, links)
    else:
        page = TaskGraphPage(poller.source, {"group_threshold": str(group_threshold)}, links)
    layout = column(page.layout(), sizing_mode="stretch_width")
    output_notebook(INLINE, hide_banner=True)  # the widget's view needs BokehJS in the page
    widget = BokehModel(layout)
    poller.add(page)
    return widget
