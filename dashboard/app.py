"""The Bokeh documents of the dashboard and the head node's token-protected server.

``make_document`` builds one page into a Bokeh document; the same function serves the
head node's own server (``DashboardServer``, started by ``python -m lumos.dashboard``)
and the jupyter-server extension (``server_ext``). Pages read a ``ClusterSource``
from the server's loop and refresh every ``REFRESH_MS``.

Read-only by construction: documents only read the source; no handler runs code, reads
files or fetches URLs. Static BokehJS is the only unauthenticated path. ``/metrics``
serves the cluster's metrics in Prometheus's text format to a scraper that sends the
login link's token (``Authorization: Bearer``, or ``?token=``) or to a logged-in browser.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from typing import Any, Callable
from urllib.parse import urlencode

from lumos.dashboard.components.common import PAGE_TITLES, Links, Page, esc, header_html, nav_html
from lumos.dashboard.source import ClusterSource
from lumos.state import RemoteError, StateClient

logger = logging.getLogger(__name__)

#: Pages refresh this often (the "at most 1 s behind" budget: poll 0.25 s + refresh 0.25 s).
REFRESH_MS = 250
#: A request's headers must arrive within this long, and so must its body (slowloris).
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 10.0
#: A ``/metrics`` scrape waits this long for the GCS, then answers 503.
METRICS_TIMEOUT_S = 10.0
#: Connections held at once by the head node's dashboard; more are closed at accept.
MAX_CONNECTIONS = 128


async def scrape(client: StateClient, lock: asyncio.Lock) -> tuple[int, str, str]:
    """A ``/metrics`` answer, ``(status, content type, body)``: the cluster's metrics in
    Prometheus's text format read through ``client``, which connects (again) under
    ``lock`` when it is not connected; 503 saying why when that takes more than
    ``METRICS_TIMEOUT_S``. The head node's server and the Jupyter server extension answer
    with it."""
    async def read() -> str:
        async with lock:
            if not client.connected:
                await client.connect(timeout_s=METRICS_TIMEOUT_S / 2)
        return await client.prometheus_text()

    try:
        return 200, "text/plain; version=0.0.4; charset=utf-8", await asyncio.wait_for(read(), METRICS_TIMEOUT_S)
    except (OSError, TimeoutError, RemoteError) as e:
        return 503, "text/plain; charset=utf-8", \
            f"503: the cluster's metrics cannot be read now ({type(e).__name__}: {e}).\n"


def page_classes() -> dict[str, type[Page]]:
    from lumos.dashboard.components.actors import ActorsPage
    from lumos.dashboard.components.gpus import GpusPage
    from lumos.dashboard.components.lineage import LineagePage
    from lumos.dashboard.components.status import StatusPage
    from lumos.dashboard.components.task_graph import TaskGraphPage
    from lumos.dashboard.components.task_stream import TaskStreamPage
    return {"status": StatusPage, "tasks": TaskStreamPage, "graph": TaskGraphPage, "lineage": LineagePage,
            "actors": ActorsPage, "gpus": GpusPage}


def request_args(doc: Any) -> dict[str, str]:
    """The page's query arguments (first value of each), as text."""
    ctx = doc.session_context
    request = getattr(ctx, "request", None) if ctx is not None else None
    out: dict[str, str] = {}
    for key, values in (getattr(request, "arguments", None) or {}).items():
        if values and key != "bokeh-session-id":
            v = values[0]
            out[key] = (v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v))[:500]
    return out


def make_document(doc: Any, page_name: str, source: ClusterSource, links: Links,
                  args: dict[str, str] | None = None) -> Page:
    """Build page ``page_name`` into ``doc`` and keep it live."""
    from bokeh.layouts import column
    from bokeh.models import Div
    if page_name not in PAGE_TITLES:
        raise ValueError(f"unknown dashboard page {page_name!r}; pages: {', '.join(PAGE_TITLES)}")
    args = request_args(doc) if args is None else args
    page = page_classes()[page_name](source, args, links)
    nav = Div(text=nav_html(page_name, links), name="nav")
    header = Div(text=header_html(source), name="header")
    body = page.layout()
    doc.add_root(column(nav, header, body, sizing_mode="stretch_width", name="root"))
    doc.title = f"lumos · {PAGE_TITLES[page_name]}"

    def refresh() -> None:
        source.touch()
        header.text = header_html(source)
        if source.tick == page.seen:
            return
        tick = source.tick
        try:
            page.update()
        except Exception as e:  # a page bug must not end the session or the server
            logger.exception("updating dashboard page %s failed", page_name)
            header.text += f"<div style='color:#d7191c'>page update failed: {esc(type(e).__name__)}: {esc(e)}</div>"
        page.seen = tick

    refresh()
    doc.add_periodic_callback(refresh, REFRESH_MS)
    return page


def applications(resolve: Callable[[Any], tuple[ClusterSource, Links]]) -> dict[str, Any]:
    """One Bokeh ``Application`` per page; ``resolve(doc)`` picks the source and link maker."""
    from bokeh.application import Application
    from bokeh.application.handlers.function import FunctionHandler

    def build(page_name: str, doc: Any) -> None:
        source, links = resolve(doc)
        make_document(doc, page_name, source, links)

    return {f"/{name}": Application(FunctionHandler(functools.partial(build, name))) for name in PAGE_TITLES}


def same_origin_ws_handler() -> type:
    """Bokeh's websocket handler, accepting only ``Origin`` == the ``Host`` the browser used."""
    from bokeh.server.views.ws import WSHandler

    from lumos.dashboard.auth import same_origin

    class SameOriginWSHandler(WSHandler):  # type: ignore[misc]
        def check_origin(self, origin: str) -> bool:
            ok = same_origin(origin, self.request.host)
            if not ok:
                logger.warning("refused a dashboard websocket from foreign Origin %r (host %r)",
                               origin, self.request.host)
            return ok

    return SameOriginWSHandler


def secure(app: Any, other_ports: bool) -> None:
    """Access log without query strings, and ``frame-ancestors`` on every response of a
    Bokeh application (``other_ports``: also the same host's other ports, where the
    notebook server embeds the head node's dashboard)."""
    from lumos.dashboard import auth
    app.settings["log_function"] = auth.log_request
    app.transforms.append(auth.security_transform(other_ports))


def capped_http_server(max_connections: int) -> type:
    """A tornado ``HTTPServer`` that closes connections beyond ``max_connections`` at accept."""
    from tornado.httpserver import HTTPServer

    class CappedHTTPServer(HTTPServer):  # type: ignore[misc]
        refused = 0

        def handle_stream(self, stream: Any, address: Any) -> None:
            if len(self._connections) >= max_connections:
                CappedHTTPServer.refused += 1
                if CappedHTTPServer.refused in (1, 10, 100) or CappedHTTPServer.refused % 1000 == 0:
                    logger.warning("dashboard: %d connection(s) refused so far, %d open (the cap)",
                                   CappedHTTPServer.refused, max_connections)
                stream.close()
                return
            super().handle_stream(stream, address)

    return CappedHTTPServer


def use_same_origin_ws(app: Any) -> None:
    from bokeh.server.views.ws import WSHandler
    handler = same_origin_ws_handler()
    for rule in app.wildcard_router.rules:
        if rule.target is WSHandler:
            rule.target = handler


# ---------------------------------------------------------------------------------------------
# The head node's own server


class DashboardServer:
    """Bokeh on ``host:port`` behind the cluster token (see ``lumos.dashboard.auth``).

    The listening sockets are bound by the caller (so the port is known and reported
    before Bokeh is even imported); ``start`` mounts Bokeh on them.
    """

    def __init__(self, source: ClusterSource, token: bytes, sockets: list[socket.socket], port: int, *,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S,
                 max_connections: int = MAX_CONNECTIONS) -> None:
        self.source = source
        self.header_timeout_s = header_timeout_s
        self.body_timeout_s = body_timeout_s
        self.max_connections = max_connections
        self._token = token
        self._sockets = sockets
        self.port = port
        self._http: Any = None
        self._bokeh: Any = None
        self._metrics_client: StateClient | None = None
        self._metrics_lock = asyncio.Lock()

    def links(self, page: str, args: dict[str, str]) -> str:
        return f"/{page}" + (f"?{urlencode(args)}" if args else "")

    def start(self) -> None:
        import tornado.web
        from bokeh.server.tornado import BokehTornado
        from tornado.ioloop import IOLoop

        from lumos.dashboard import auth
        token = self._token
        cookie = auth.cookie_name(self.port)
        secret = auth.bokeh_secret(token)
        apps = applications(lambda doc: (self.source, self.links))

        class Forbidden(tornado.web.RequestHandler):
            def prepare(self) -> None:
                self.set_status(403)
                self.set_header("Content-Type", "text/plain; charset=utf-8")
                if self.request.path == "/metrics":
                    self.finish("403: /metrics needs the token of the dashboard's login link (printed by "
                                "lumos.init() as dashboard_url, and by `lumos status`) as "
                                "'Authorization: Bearer TOKEN' or '?token=TOKEN'.\n")
                    return
                self.finish("403: this lumos dashboard needs its login link "
                            "(printed by lumos.init() as dashboard_url, and by `lumos status`).\n")

        class Login(tornado.web.RequestHandler):
            def get(self) -> None:
                given = self.get_query_argument("token", "")
                if not given or not auth.check_login(token, given):
                    self.set_status(403)
                    self.set_header("Content-Type", "text/plain; charset=utf-8")
                    self.finish("403: wrong or missing dashboard token.\n")
                    return
                self.set_cookie(cookie, auth.make_cookie(token), httponly=True, samesite="Lax",
                                expires_days=auth.COOKIE_TTL_S / 86400, path="/")
                page = self.get_query_argument("page", "status")
                target = "/" + (page if page in PAGE_TITLES else "status")
                obj = self.get_query_argument("object", "")
                if obj and obj.isalnum() and len(obj) <= 128:
                    target += "?" + urlencode({"object": obj})
                self.redirect(target)

        class Root(tornado.web.RequestHandler):
            def get(self) -> None:
                self.redirect("/status")

        server = self

        class Metrics(tornado.web.RequestHandler):
            async def get(self) -> None:
                self.set_header("Cache-Control", "no-store")
                status, content_type, body = await scrape(server._scrape_client(), server._metrics_lock)
                self.set_status(status)
                self.set_header("Content-Type", content_type)
                self.finish(body)

        bokeh = BokehTornado(apps, prefix="", use_index=False, redirect_root=False, secret_key=secret,
                             sign_sessions=True, generate_session_ids=True,
                             extra_patterns=[(r"/login", Login), (r"/metrics", Metrics), (r"/", Root)],
                             websocket_max_message_size_bytes=16 * 1024 * 1024)
        use_same_origin_ws(bokeh)
        secure(bokeh, other_ports=True)
        bokeh.initialize(IOLoop.current())
        bokeh.start()
        self._bokeh = bokeh
        self._http = capped_http_server(self.max_connections)(
            _guard(bokeh, Forbidden, token, cookie, secret), xheaders=False,
            idle_connection_timeout=self.header_timeout_s, body_timeout=self.body_timeout_s,
            max_header_size=64 * 1024, max_body_size=1024 * 1024)
        self._http.add_sockets(self._sockets)

    def _scrape_client(self) -> StateClient:
        """The GCS connection of the endpoint's own (made at the first scrape), not the
        pages' poll loop."""
        client = self._metrics_client
        if client is None:
            client = self._metrics_client = StateClient(self.source.client.address, self._token,
                                                        name="dashboard-metrics->gcs")
        return client

    def stop(self) -> None:
        if self._metrics_client is not None:
            self._metrics_client.close()
        if self._http is not None:
            self._http.stop()
        if self._bokeh is not None:
            self._bokeh.stop()
        self.source.close()


def _guard(app: Any, forbidden: type, token: bytes, cookie: str, secret: bytes) -> Any:
    """Routes a request to Bokeh only when it carries proof of the token, else to 403.

    Pages: the login cookie, or a Bokeh session id signed with our secret that has not
    expired (``auth.check_session_id``; Bokeh checks the signature again). Websockets: the same Origin as Host, and the cookie or a
    signed Bokeh token. Static BokehJS and ``/login`` are open.
    """
    from tornado.routing import Router

    class Guard(Router):  # type: ignore[misc]
        def find_handler(self, request: Any, **kwargs: Any) -> Any:
            if _allowed(request, token, cookie, secret):
                return app.find_handler(request, **kwargs)
            return app.get_handler_delegate(request, forbidden)

    return Guard()


def _allowed(request: Any, token: bytes, cookie: str, secret: bytes) -> bool:
    from http.cookies import CookieError, SimpleCookie

    from bokeh.util.token import check_token_signature

    from lumos.dashboard import auth
    path = request.path
    if path.startswith("/static/") or path == "/login" or path == "/favicon.ico":
        return True
    if path == "/metrics" and _scrape_allowed(request, token):
        return True
    cookie_ok = False
    raw = request.headers.get("Cookie")
    if raw:
        try:
            jar: SimpleCookie = SimpleCookie()
            jar.load(raw)
            morsel = jar.get(cookie)
            cookie_ok = morsel is not None and auth.check_cookie(token, morsel.value)
        except CookieError:
            cookie_ok = False
    if request.headers.get("Upgrade", "").lower() == "websocket":
        if not auth.same_origin(request.headers.get("Origin"), request.host):
            return False
        if cookie_ok:
            return True
        proto = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        return len(proto) == 2 and proto[0] == "bokeh" and _signed(proto[1], secret, check_token_signature)
    if cookie_ok:
        return True
    ids = request.query_arguments.get("bokeh-session-id")
    if ids:
        return auth.check_session_id(secret, ids[0].decode("ascii", "replace"))
    return False


def _scrape_allowed(request: Any, token: bytes) -> bool:
    """A Prometheus scrape of ``/metrics``: the login token as ``Authorization: Bearer``
    (Prometheus's ``authorization: {credentials: ...}``) or as ``?token=`` (its ``params``);
    a logged-in browser's cookie passes the general check."""
    from lumos.dashboard import auth
    header = request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer " and auth.check_login(token, header[7:].strip()):
        return True
    given = request.query_arguments.get("token")
    return bool(given) and auth.check_login(token, given[0].decode("ascii", "replace"))


def _signed(token: str, secret: bytes, check: Callable[..., bool]) -> bool:
    try:
        return bool(check(token, secret_key=secret, signed=True))
    except Exception:  # malformed tokens raise assorted errors inside bokeh
        return False
