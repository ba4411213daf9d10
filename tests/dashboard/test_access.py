"""The dashboard refuses everyone without the token, and foreign-Origin websockets.

Plain HTTP and websocket clients (no browser) against the head node's dashboard.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from typing import Any

import pytest
import websocket

import lumos
from lumos.dashboard.components.common import PAGE_TITLES
from tests.dashboard.conftest import base_url

pytestmark = pytest.mark.timeout(120)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def fetch(url: str, opener: Any = None, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with (opener or urllib.request.build_opener(_NoRedirect)).open(req, timeout=20) as r:
            return r.status, r.read().decode("utf-8", "replace"), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace"), e.headers


@pytest.fixture(scope="module")
def logged_in(dash_cluster: lumos.LumosContext) -> tuple[Any, CookieJar]:
    jar = CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    status, body, _ = fetch(dash_cluster.dashboard_url, opener)
    assert status == 200 and "bokeh" in body.lower()
    return opener, jar


def test_every_page_refused_without_the_token(dash_cluster: lumos.LumosContext) -> None:
    base = base_url(dash_cluster.dashboard_url)
    for path in ["/", *(f"/{p}" for p in PAGE_TITLES), "/status/autoload.js?bokeh-autoload-element=x",
                 "/metadata", "/nope"]:
        status, body, _ = fetch(base + path)
        assert status == 403, (path, status)
        assert "login link" in body
    # A wrong login token, a forged or unsigned Bokeh session id: refused too.
    assert fetch(base + "/login?token=" + "0" * 40)[0] == 403
    assert fetch(base + "/login")[0] == 403
    assert fetch(base + "/status?bokeh-session-id=forged")[0] == 403
    assert fetch(base + "/status?bokeh-session-id=" + "a" * 44 + "-" + "b" * 43)[0] == 403
    # The cluster token itself is not the login token (it never travels in URLs).
    with open(dash_cluster.address_info["session_dir"] + "/token") as f:
        cluster_token = f.read().strip()
    assert cluster_token not in dash_cluster.dashboard_url
    assert fetch(base + "/login?token=" + cluster_token)[0] == 403


def test_login_sets_a_cookie_that_opens_every_page(dash_cluster: lumos.LumosContext,
                                                   logged_in: tuple[Any, CookieJar]) -> None:
    opener, jar = logged_in
    cookies = {c.name: c for c in jar}
    port = int(dash_cluster.dashboard_url.split(":")[2].split("/")[0])
    assert f"lumos_dashboard_{port}" in cookies
    base = base_url(dash_cluster.dashboard_url)
    for page in PAGE_TITLES:
        status, body, _ = fetch(f"{base}/{page}", opener)
        assert status == 200, page
        assert "bokeh-session-id" in body or "token" in body
    # Static BokehJS is the only open path.
    assert fetch(base + "/static/js/bokeh.min.js")[0] == 200


def _ws_url(dash_cluster: lumos.LumosContext, page: str = "status") -> str:
    return base_url(dash_cluster.dashboard_url).replace("http://", "ws://") + f"/{page}/ws"


def _page_token(opener: Any, dash_cluster: lumos.LumosContext) -> str:
    _, body, _ = fetch(base_url(dash_cluster.dashboard_url) + "/status", opener)
    match = re.search(r'"token":\s*"([^"]+)"', body) or re.search(r"token&quot;:&quot;([^&]+)&quot;", body)
    assert match, "no Bokeh session token in the page"
    return match.group(1)


def test_websocket_refused_without_token_or_from_a_foreign_origin(dash_cluster: lumos.LumosContext,
                                                                  logged_in: tuple[Any, CookieJar]) -> None:
    opener, jar = logged_in
    url = _ws_url(dash_cluster)
    host = base_url(dash_cluster.dashboard_url).split("//", 1)[1]
    origin = f"http://{host}"
    # No cookie, no token.
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(url, origin=origin, timeout=10)
    assert e.value.status_code == 403
    # A forged Bokeh token.
    with pytest.raises(websocket.WebSocketBadStatusException) as e:
        websocket.create_connection(url, origin=origin, subprotocols=["bokeh", "forged.token.x"], timeout=10)
    assert e.value.status_code == 403
    token = _page_token(opener, dash_cluster)
    # A valid token from a foreign Origin (a page on another site using the browser's cookie).
    cookie = "; ".join(f"{c.name}={c.value}" for c in jar)
    for bad in ("http://evil.example", "null", f"http://{host}.evil.example"):
        with pytest.raises(websocket.WebSocketBadStatusException) as e:
            websocket.create_connection(url, origin=bad, cookie=cookie, subprotocols=["bokeh", token], timeout=10)
        assert e.value.status_code == 403, bad
    # The same token from the dashboard's own origin works.
    ws = websocket.create_connection(url, origin=origin, subprotocols=["bokeh", token], timeout=10)
    try:
        assert ws.recv()  # Bokeh's ACK / first message
    finally:
        ws.close()
