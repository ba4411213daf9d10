"""The dashboard refuses everyone without the token, and foreign-Origin websockets.

Plain HTTP and websocket clients (no browser) against the head node's dashboard.
"""

from __future__ import annotations

import os
import re
import select
import socket
import time
import urllib.error
import urllib.request
from http.cookiejar import CookieJar
from typing import Any

import pytest
import websocket

import lumos
from lumos.dashboard.components.common import PAGE_TITLES
from tests.conftest import wait_for
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


def test_access_log_leaves_out_query_strings(dash_cluster: lumos.LumosContext,
                                             logged_in: tuple[Any, CookieJar]) -> None:
    opener, _ = logged_in
    login = dash_cluster.dashboard_url.split("token=", 1)[1].split("&", 1)[0]
    assert fetch(dash_cluster.dashboard_url)[0] == 302
    assert fetch(base_url(dash_cluster.dashboard_url) + "/status?bokeh-session-id=secret-looking-id")[0] == 403
    log = os.path.join(dash_cluster.address_info["session_dir"], "logs", "dashboard.log")

    def read() -> str:
        with open(log) as f:
            text = f.read()
        return text if "GET /login " in text and "GET /status " in text else ""
    text = wait_for(read)
    assert login not in text and "secret-looking-id" not in text and "token=" not in text


def test_every_response_forbids_framing_by_other_sites(dash_cluster: lumos.LumosContext,
                                                       logged_in: tuple[Any, CookieJar]) -> None:
    opener, _ = logged_in
    base = base_url(dash_cluster.dashboard_url)
    # The notebook server on the same host (another port) may embed it; other sites may not.
    want = ("frame-ancestors 'self' http://127.0.0.1:* https://127.0.0.1:* http://localhost:* https://localhost:*"
            " http://[::1]:* https://[::1]:*")
    for url, who in ((f"{base}/status", opener), (f"{base}/status", None), (dash_cluster.dashboard_url, None)):
        _, _, headers = fetch(url, who)
        assert headers["Content-Security-Policy"] == want, url


def test_a_bokeh_session_id_in_a_url_is_not_a_lasting_password() -> None:
    from lumos.dashboard import auth
    secret, now = b"s" * 32, 1_800_000_000.0
    sid = auth.mint_session_id(secret, now=now)
    assert auth.check_session_id(secret, sid, now=now + 10)
    assert not auth.check_session_id(secret, sid, now=now + auth.SESSION_ID_TTL_S + 1)
    assert not auth.check_session_id(b"t" * 32, sid, now=now)
    # The expiry is under the signature: pushing it later breaks the id.
    base, sig = sid.split(".", 1)
    later = base.rsplit("x", 1)[0] + f"x{int(now + 10 * auth.SESSION_ID_TTL_S):x}"
    assert not auth.check_session_id(secret, f"{later}.{sig}", now=now + auth.SESSION_ID_TTL_S + 1)
    # Bokeh's own ids (no expiry) are not accepted in URLs.
    from bokeh.util.token import generate_session_id
    assert not auth.check_session_id(secret, generate_session_id(secret_key=secret, signed=True), now=now)


@pytest.mark.slow
def test_half_sent_requests_are_capped_and_timed_out(dash_cluster: lumos.LumosContext,
                                                     logged_in: tuple[Any, CookieJar]) -> None:
    """200 connections that never finish their headers (slowloris): the server holds at
    most its cap, drops the rest at once, the held ones after the header timeout, and
    answers a real request afterwards."""
    from lumos.dashboard.app import HEADER_TIMEOUT_S, MAX_CONNECTIONS
    opener, _ = logged_in
    host, port = base_url(dash_cluster.dashboard_url).split("//", 1)[1].split(":")
    socks = []
    try:
        for i in range(200):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n" if i % 2 else
                      b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\nab")
            socks.append(s)
        start = time.monotonic()
        closed: set[int] = set()

        def poll_closed() -> None:
            ready, _, _ = select.select([s for i, s in enumerate(socks) if i not in closed], [], [], 0.2)
            for s in ready:
                try:
                    data = s.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    closed.add(socks.index(s))

        wait_for(lambda: poll_closed() or len(closed) >= 200 - MAX_CONNECTIONS, timeout_s=10)
        assert time.monotonic() - start < HEADER_TIMEOUT_S  # dropped at once, not timed out
        wait_for(lambda: poll_closed() or len(closed) == 200, timeout_s=HEADER_TIMEOUT_S + 20)
    finally:
        for s in socks:
            s.close()
    status, _, _ = fetch(base_url(dash_cluster.dashboard_url) + "/status", opener)
    assert status == 200


def test_metrics_for_a_scraper_with_the_login_token_only(dash_cluster: lumos.LumosContext,
                                                         logged_in: tuple[Any, CookieJar]) -> None:
    """``/metrics`` serves Prometheus text to a scraper holding the login link's token
    (bearer or query), or to a logged-in browser; nothing else reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    from lumos.util.metrics import Counter
    Counter("dash_scraped", description="Counted by the test driver.").inc(4)
    lumos.state.metrics()  # reported
    base = base_url(dash_cluster.dashboard_url)
    login = re.search(r"token=([0-9a-f]+)", dash_cluster.dashboard_url).group(1)  # type: ignore[union-attr]
    with open(os.path.join(dash_cluster.address_info["session_dir"], "token")) as f:
        cluster_token = f.read().strip()
    for headers, query in (({}, ""), ({"Authorization": "Bearer " + "0" * 40}, ""), ({}, "?token=nope"),
                           ({"Authorization": "Bearer " + cluster_token}, ""), ({"Authorization": login}, "")):
        status, body, _ = fetch(base + "/metrics" + query, headers=headers)
        assert status == 403 and "Authorization: Bearer" in body, (headers, query, status)
        assert "dash_scraped" not in body
    opener, _ = logged_in
    for how, (status, body, head) in {
            "bearer": fetch(base + "/metrics", headers={"Authorization": "Bearer " + login}),
            "query": fetch(base + "/metrics?token=" + login),
            "cookie": fetch(base + "/metrics", opener)}.items():
        assert status == 200, (how, status, body[:200])
        assert head["Content-Type"].startswith("text/plain; version=0.0.4"), how
        found = {(s.name, tuple(s.labels.items())): s.value
                 for f in text_string_to_metric_families(body) for s in f.samples}
        assert found[("dash_scraped_total", ())] == 4.0, how
        assert found[("lumos_nodes", (("state", "ALIVE"),))] == 1, how
