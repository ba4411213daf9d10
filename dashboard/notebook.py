"""The dashboard in notebook cells: ``show(page)`` (a live page in an IFrame) and
``graph(ref)`` (the task graph, or one object's lineage, as a live ``jupyter_bokeh``
widget). Called by ``%lumos dashboard [PAGE]`` and ``%lumos graph [REF]``.

Where the page comes from: through the jupyter-server extension when the kernel runs
under a Jupyter server (the only port a Binder or remote JupyterLab user can reach),
else the head node's own dashboard URL. The kernel learns the browser-side base URL
from, in order: ``LUMOS_DASHBOARD_URL``, ``JUPYTERHUB_SERVICE_PREFIX``, the
``jpserver-<pid>.json`` of the server that launched it (``JPY_PARENT_PID``).

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
    from lumos._private import worker_context
    ctx = worker_context.context
    if ctx is None or not getattr(ctx, "address_info", None):
        raise RuntimeError("no lumos cluster in this kernel: call lumos.init() first")
    return ctx


def jupyter_base_url() -> str | None:
    """The Jupyter server's base URL as the browser sees it, or None outside a Jupyter server."""
    explicit = os.environ.get("LUMOS_DASHBOARD_URL")
    if explicit:
        return explicit if explicit.endswith("/") else explicit + "/"
    hub = os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if hub:
        return hub if hub.endswith("/") else hub + "/"
    parent = os.environ.get("JPY_PARENT_PID")
    if parent and parent.isdigit():
        try:
            from jupyter_core.paths import jupyter_runtime_dir
            with open(os.path.join(jupyter_runtime_dir(), f"jpserver-{parent}.json")) as f:
                base = str(json.load(f).get("base_url") or "/")
            return base if base.endswith("/") else base + "/"
        except (OSError, ValueError, ImportError):
            return None
    return None


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


def dashboard_url(page: str = "status", *, object: Any = None, via_jupyter: bool | None = None) -> str:
    """The URL of a dashboard page of this kernel's cluster.

    Args:
        page: one of status, tasks, graph, lineage, actors, gpus.
        object: for ``lineage``, an ObjectRef or its hex id.
        via_jupyter: force (True) or avoid (False) the jupyter-server extension; by
            default used whenever the kernel runs under a Jupyter server.

    Raises:
        ValueError: unknown page; RuntimeError: no cluster (or no dashboard) here.
    """
    _check_page(page)
    ctx = _context()
    obj = _object_hex(object)
    base = jupyter_base_url() if via_jupyter in (None, True) else None
    if via_jupyter and base is None:
        raise RuntimeError("this kernel does not run under a Jupyter server")
    if base is not None:
        args = {"cluster": os.path.basename(ctx.address_info["session_dir"].rstrip("/"))}
        if obj:
            args["object"] = obj
        return f"{base}lumos/dashboard/{page}?{urlencode(args)}"
    if not ctx.dashboard_url:
        raise RuntimeError("this cluster runs without a dashboard (include_dashboard=False)")
    args = {"page": page}
    if obj:
        args["object"] = obj
    return f"{ctx.dashboard_url}&{urlencode(args)}"


def show(page: str = "status", *, object: Any = None, height: int = 620, via_jupyter: bool | None = None) -> Any:
    """Embed a live dashboard page in the cell output (an ``IPython.display.IFrame``).

    Example:
        >>> lumos.dashboard.show("graph")
    """
    from IPython.display import IFrame
    return IFrame(dashboard_url(page, object=object, via_jupyter=via_jupyter), width="100%", height=height)


# --------------------------------------------------------------------------------- live widget


class _Poller:
    """A ClusterSource on its own loop in the ``lumos-dashboard`` thread (one per kernel)."""

    def __init__(self, session_dir: str, gcs_address: str) -> None:
        from lumos._private.gcs.client import GcsClient
        from lumos._private.process import read_token
        from lumos.dashboard.source import ClusterSource
        sock = os.path.join(session_dir, "sockets", "gcs.sock")
        address = sock if os.path.exists(sock) else gcs_address
        client = GcsClient(address, read_token(os.path.join(session_dir, "token")), name="notebook-graph->gcs")
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
