"""Access control of the head node's dashboard, derived from the cluster token.

The cluster token itself never appears in a URL or cookie (it lets a holder run code
on the cluster); the dashboard uses keys derived from it with HMAC:

- the **login token**, carried once by the login link ``/login?token=...``;
- the **cookie key**, signing the ``lumos_dashboard_<port>`` cookie the login sets;
- the **Bokeh secret**, signing Bokeh session ids and websocket tokens.

```
browser --GET /login?token=T--> LoginHandler --Set-Cookie, 302--> /status
browser --GET /status (cookie)--> Guard --> Bokeh (mints a signed session id)
browser --WS /status/ws (signed token, same Origin)--> Guard --> Bokeh
anything else --> 403
```
"""

from __future__ import annotations

import hashlib
import hmac
import time
from typing import Any
from urllib.parse import urlparse

#: How long a login lasts (the cookie's lifetime).
COOKIE_TTL_S = 7 * 24 * 3600


def derive(token: bytes, purpose: str) -> bytes:
    return hmac.new(token, b"lumos-dashboard:" + purpose.encode(), hashlib.sha256).digest()


def login_token(token: bytes) -> str:
    """The secret the login link carries (not the cluster token)."""
    return derive(token, "login").hex()[:40]


def bokeh_secret(token: bytes) -> bytes:
    return derive(token, "bokeh-sessions").hex().encode()


def cookie_name(port: int) -> str:
    # Cookies are per host, not per port: name them per port so two local clusters'
    # dashboards do not log each other out.
    return f"lumos_dashboard_{port}"


def make_cookie(token: bytes, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + COOKIE_TTL_S)
    mac = hmac.new(derive(token, "cookie"), str(expires).encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def check_cookie(token: bytes, value: str | None, now: float | None = None) -> bool:
    if not value or "." not in value or len(value) > 200:
        return False
    expires, _, mac = value.partition(".")
    if not expires.isdigit() or int(expires) < (time.time() if now is None else now):
        return False
    want = hmac.new(derive(token, "cookie"), expires.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, mac)


def check_login(token: bytes, given: str) -> bool:
    return hmac.compare_digest(login_token(token).encode(), given.encode()[:200])


def same_origin(origin: str | None, host: str | None) -> bool:
    """A websocket's Origin must name the host the browser connected to."""
    if not origin or not host:
        return False
    return urlparse(origin).netloc.lower() == host.lower()


#: A Bokeh session id minted for a page URL opens that page for this long only: the URL
#: lands in browser history and Referer headers, and must not work as a lasting password.
SESSION_ID_TTL_S = 300
#: Every response forbids framing by other sites (clickjacking); ``frame_ancestors`` adds
#: the host's other ports where a notebook server embeds the head node's dashboard.
CSP_HEADER = "Content-Security-Policy"


def mint_session_id(secret: bytes, now: float | None = None) -> str:
    """A signed Bokeh session id that carries its expiry: ``<random>x<expiry hex>.<signature>``."""
    import secrets

    from bokeh.util.token import _signature  # Bokeh's own signing, so Bokeh accepts the id
    expires = int((time.time() if now is None else now) + SESSION_ID_TTL_S)
    base = f"{secrets.token_hex(20)}x{expires:x}"
    return f"{base}.{_signature(base, secret)}"


def check_session_id(secret: bytes, session_id: str | None, now: float | None = None) -> bool:
    """A session id minted by ``mint_session_id`` with ``secret`` that has not expired."""
    from bokeh.util.token import check_session_id_signature
    if not session_id or len(session_id) > 200 or "." not in session_id:
        return False
    base = session_id.split(".", 1)[0]
    _, sep, expiry = base.rpartition("x")
    if not sep or not expiry or any(c not in "0123456789abcdef" for c in expiry):
        return False
    now = time.time() if now is None else now
    if not now <= int(expiry, 16) <= now + SESSION_ID_TTL_S + 5:
        return False
    try:
        return bool(check_session_id_signature(session_id, secret_key=secret, signed=True))
    except (ValueError, TypeError, UnicodeError):
        return False


_LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def frame_ancestors(host: str | None, other_ports: bool) -> str:
    """The CSP value for a page served to ``host`` (the request's Host header); with
    ``other_ports``, the same host's other ports may frame it too (all loopback names
    when it is loopback: Lab at localhost:8888 embeds 127.0.0.1:8265)."""
    value = "frame-ancestors 'self'"
    if other_ports and host:
        name = urlparse("//" + host).hostname
        if name and all(c.isalnum() or c in ".-:" for c in name):
            name = f"[{name}]" if ":" in name else name
            names = _LOOPBACK if name in _LOOPBACK else (name,)
            value += "".join(f" http://{n}:* https://{n}:*" for n in names)
    return value


def log_request(handler: object) -> None:
    """Tornado access log without the query string (it carries login tokens and session ids)."""
    import logging
    log = logging.getLogger("tornado.access")
    request = handler.request  # type: ignore[attr-defined]
    status = handler.get_status()  # type: ignore[attr-defined]
    level = logging.INFO if status < 400 else logging.WARNING if status < 500 else logging.ERROR
    if log.isEnabledFor(level):
        log.log(level, "%d %s %s (%s) %.2fms", status, request.method, request.path, request.remote_ip,
                1000.0 * request.request_time())


def security_transform(other_ports: bool) -> type:
    """A tornado output transform adding the CSP header to every response."""
    from tornado.web import OutputTransform

    class SecurityHeaders(OutputTransform):  # type: ignore[misc]
        def transform_first_chunk(self, status_code: int, headers: Any, chunk: bytes,
                                  finishing: bool) -> tuple[int, Any, bytes]:
            headers[CSP_HEADER] = frame_ancestors(self._host, other_ports)
            return status_code, headers, chunk

        def __init__(self, request: Any) -> None:
            super().__init__(request)
            self._host = request.host

    return SecurityHeaders
