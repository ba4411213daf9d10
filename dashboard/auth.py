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
