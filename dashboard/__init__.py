"""lumos's live dashboard: Bokeh pages over GCS state, and a jupyter-server extension.

- ``python -m lumos.dashboard`` runs the head node's server (``app.DashboardServer``),
  started by ``lumos.init()`` and ``lumos start --head``.
- As a jupyter-server extension (``lumos.dashboard``) the same pages live under
  ``{base_url}lumos/`` behind Jupyter's own login (``server_ext``).
- In notebooks, ``show(page)`` embeds a live page and ``graph(ref)`` a live task-graph
  or lineage widget (``notebook``).

Importing this package stays cheap: Bokeh is imported by the functions that need it.

What lives here: ``source.py`` (``ClusterSource``: the GCS state mirror every page
reads), ``graph_layout.py`` (pure layout of the task graph), ``components/`` (one file
per page), ``app.py`` (the Bokeh server), ``auth.py``, ``server_ext.py``,
``notebook.py``, ``host.py`` and ``__main__.py``.

May import: lumos's public API, ``lumos.state`` (``StateClient`` reads the GCS) and
``lumos.util`` (``session``: session directories, process plumbing); never
``lumos._private`` (``tests/test_public_surfaces.py`` checks every import). lumos's
runtime never imports this package at module level.
"""

from __future__ import annotations

from typing import Any

__all__ = ["show", "graph", "dashboard_url"]


def show(page: str = "status", **kwargs: Any) -> Any:
    from lumos.dashboard.notebook import show as _show
    return _show(page, **kwargs)


def graph(ref: Any = None, **kwargs: Any) -> Any:
    from lumos.dashboard.notebook import graph as _graph
    return _graph(ref, **kwargs)


def dashboard_url(page: str = "status", **kwargs: Any) -> str:
    from lumos.dashboard.notebook import dashboard_url as _url
    return _url(page, **kwargs)


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "lumos.dashboard"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    from lumos.dashboard.server_ext import load
    load(serverapp)
