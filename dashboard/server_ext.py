"""The dashboard inside a Jupyter server: ``{base_url}lumos/``, behind Jupyter's login.

What Binder and remote JupyterLab users need: no port but the notebook server's.
The same Bokeh documents as the head node's server run in the Jupyter server process:

```
browser --GET {base}lumos/dashboard/graph?cluster=session_…  (Jupyter login required)
        <-- 302 {base}lumos/bokeh/graph?cluster=…&bokeh-session-id=<signed>
browser --GET that page, then WS {base}lumos/bokeh/graph/ws (same Origin, signed token)
```
Bokeh pages need a session id signed by this server's secret (made fresh at start-up)
and minted less than ``auth.SESSION_ID_TTL_S`` ago, so the launcher, which requires
Jupyter's login, is the only way in, and a page URL copied later opens nothing.
Responses carry ``Content-Security-Policy: frame-ancestors 'self'``; the access log
leaves out query strings.

``{base_url}lumos/metrics?cluster=…`` serves the cluster's metrics in Prometheus's text
format, as the head node's ``/metrics`` does, to whoever passes Jupyter's login: a
scraper sends the Jupyter token (``Authorization: token <t>``, Prometheus's
``authorization: {type: token, credentials: …}``); without it the answer is 403, never
a redirect to the login page.

The cluster is found through its session directory (``?cluster=`` names it; it is
checked against a strict pattern and must exist under lumos's session root), never
from an address in the URL: the extension reads the token and the GCS's Unix socket
from there, so only clusters on this machine, run by this user, can be shown.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import re
import secrets
from typing import Any
from urllib.parse import urlencode

from lumos.dashboard.components.common import PAGE_TITLES

logger = logging.getLogger(__name__)

_CLUSTER = re.compile(r"^session_[A-Za-z0-9_-]{1,120}$")


def marker_path(runtime_dir: str, server_pid: int) -> str:
    """Where a Jupyter server with the extension loaded says so to its kernels."""
    return os.path.join(runtime_dir, f"lumos-dashboard-{server_pid}.json")


def _write_marker(serverapp: Any, base_url: str) -> None:
    from lumos.util.session import write_private_file
    path = marker_path(serverapp.runtime_dir, os.getpid())
    try:
        os.makedirs(serverapp.runtime_dir, exist_ok=True)
        if os.path.lexists(path):
            os.unlink(path)  # left by an earlier server with our pid
        write_private_file(path, json.dumps({"base_url": base_url, "pid": os.getpid()}).encode())
    except OSError as e:
        serverapp.log.warning("lumos dashboard: cannot write %s (%s); kernels will link the head node's "
                              "dashboard instead of this server's", path, e)
        return

    def remove() -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    atexit.register(remove)


def session_root() -> str:
    from lumos.util.session import session_root as root
    return root()


def find_session(name: str) -> str:
    """The session directory of cluster ``name`` (or of the newest live one when empty).

    Raises:
        LookupError: no such live cluster on this machine.
        ValueError: ``name`` is not a session name.
    """
    root = session_root()
    if not name:
        live = []
        try:
            entries = os.listdir(root)
        except OSError:
            entries = []
        for entry in entries:
            if _CLUSTER.match(entry) and os.path.exists(os.path.join(root, entry, "sockets", "gcs.sock")):
                live.append((os.path.getmtime(os.path.join(root, entry)), entry))
        if not live:
            raise LookupError("no lumos cluster is running on this machine; call lumos.init() in a notebook first")
        name = max(live)[1]
    if not _CLUSTER.match(name):
        raise ValueError(f"not a lumos cluster name: {name[:80]!r}")
    path = os.path.join(root, name)
    if not os.path.exists(os.path.join(path, "sockets", "gcs.sock")):
        raise LookupError(f"no running lumos cluster named {name}")
    return path


class _Sources:
    """One ClusterSource per cluster, made on first use, on the Jupyter server's loop."""

    def __init__(self) -> None:
        self.by_name: dict[str, Any] = {}
        self.metrics: dict[str, tuple[Any, asyncio.Lock]] = {}

    def get(self, name: str) -> Any:
        from lumos.dashboard.source import ClusterSource
        from lumos.state import StateClient
        path = find_session(name)
        name = os.path.basename(path)
        source = self.by_name.get(name)
        if source is None:
            source = ClusterSource(StateClient.for_session(path, name="jupyter-dashboard->gcs"), label=name)
            self.by_name[name] = source
        return source

    def metrics_client(self, name: str) -> tuple[Any, asyncio.Lock]:
        """The GCS connection of cluster ``name``'s scrapes (not its pages' poll loop),
        opened by the first scrape, and the lock its (re)connects take."""
        from lumos.state import StateClient
        path = find_session(name)
        name = os.path.basename(path)
        entry = self.metrics.get(name)
        if entry is None:
            entry = self.metrics[name] = (StateClient.for_session(path, name="jupyter-metrics->gcs"),
                                          asyncio.Lock())
        return entry

    def close(self) -> None:
        for source in self.by_name.values():
            source.close()
        self.by_name.clear()
        for client, _ in self.metrics.values():
            client.close()
        self.metrics.clear()


def load(serverapp: Any) -> None:
    """Mount the dashboard into a jupyter-server (``_load_jupyter_server_extension``)."""
    import tornado.web
    from bokeh.server.tornado import BokehTornado
    from jupyter_server.base.handlers import APIHandler, JupyterHandler
    from jupyter_server.utils import url_path_join
    from tornado.ioloop import IOLoop
    from tornado.routing import PathMatches, Router

    from lumos.dashboard import auth
    from lumos.dashboard.app import applications, request_args, scrape, secure, use_same_origin_ws

    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    prefix = url_path_join(base, "lumos", "bokeh")
    launch = url_path_join(base, "lumos", "dashboard")
    secret = secrets.token_urlsafe(32).encode()
    sources = _Sources()

    def resolve(doc: Any) -> tuple[Any, Any]:
        cluster = request_args(doc).get("cluster", "")
        source = sources.get(cluster)
        name = source.label

        def links(page: str, args: dict[str, str]) -> str:
            return url_path_join(launch, page) + "?" + urlencode({"cluster": name, **args})
        return source, links

    bokeh = BokehTornado(applications(resolve), prefix=prefix, use_index=False, redirect_root=False,
                         secret_key=secret, sign_sessions=True, generate_session_ids=False)
    use_same_origin_ws(bokeh)
    secure(bokeh, other_ports=False)
    bokeh.initialize(IOLoop.current())
    bokeh.start()
    web_app.settings["lumos_bokeh"] = bokeh
    web_app.settings["lumos_sources"] = sources

    class Launcher(JupyterHandler):  # type: ignore[misc]
        """Jupyter-authenticated entry: mints a signed Bokeh session id and redirects."""

        @tornado.web.authenticated
        def get(self, page: str = "status") -> None:
            if page not in PAGE_TITLES:
                raise tornado.web.HTTPError(404, f"no dashboard page {page!r}; pages: {', '.join(PAGE_TITLES)}")
            cluster = self.get_query_argument("cluster", "")
            try:
                name = os.path.basename(find_session(cluster))
            except ValueError as e:
                raise tornado.web.HTTPError(400, str(e)) from None
            except LookupError as e:
                raise tornado.web.HTTPError(404, str(e)) from None
            args = {"cluster": name}
            obj = self.get_query_argument("object", "")
            if obj and obj.isalnum() and len(obj) <= 128:
                args["object"] = obj
            args["bokeh-session-id"] = auth.mint_session_id(secret)
            self.redirect(url_path_join(prefix, page) + "?" + urlencode(args))

    class Metrics(APIHandler):  # type: ignore[misc]
        """Jupyter-authenticated Prometheus scrape (an API handler: 403 without the login;
        errors in the cluster argument are JSON, as Jupyter's API answers them)."""

        @tornado.web.authenticated
        async def get(self) -> None:
            self.set_header("Cache-Control", "no-store")
            try:
                client, lock = sources.metrics_client(self.get_query_argument("cluster", ""))
            except ValueError as e:
                raise tornado.web.HTTPError(400, str(e)) from None
            except LookupError as e:
                raise tornado.web.HTTPError(404, str(e)) from None
            status, content_type, body = await scrape(client, lock)
            self.set_status(status)
            self.finish(body, set_content_type=content_type)

    class Expired(tornado.web.RequestHandler):
        def prepare(self) -> None:
            self.set_status(403)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.finish("403: this dashboard link has expired or was not made by this server; "
                        f"open {launch}/status again.\n")

    class Gate(Router):  # type: ignore[misc]
        """Pages need a fresh session id from the launcher; static files and websockets
        (whose Bokeh token expires on its own) go straight to Bokeh."""

        def find_handler(self, request: Any, **kwargs: Any) -> Any:
            rest = request.path[len(prefix):]
            if not (rest.startswith("/static/") or rest.endswith("/ws")):
                ids = request.query_arguments.get("bokeh-session-id") or [b""]
                if not auth.check_session_id(secret, ids[0].decode("ascii", "replace")):
                    return bokeh.get_handler_delegate(request, Expired)
            return bokeh.find_handler(request, **kwargs)

    # jupyter_server's add_handlers audits handler classes; a whole tornado application
    # (Bokeh's router) goes in through tornado's own method.
    tornado.web.Application.add_handlers(web_app, ".*$", [(PathMatches(prefix + "/.*"), Gate())])
    web_app.add_handlers(".*$", [(launch + r"/(\w+)", Launcher), (launch + "/?", Launcher),
                                 (url_path_join(base, "lumos", "metrics"), Metrics)])
    _write_marker(serverapp, base)
    serverapp.log.info("lumos dashboard mounted at %s", launch)
