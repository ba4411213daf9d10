"""Connection authentication: HMAC-SHA256 of a server nonce with the cluster token.

```
server                         client
  | -- nonce (32 random bytes) -> |
  | <- HMAC(token, nonce) -------- |
  | -- b"ok" -------------------> |   then msgpack frames both ways
```
Nothing but these frames is read before the check passes.
"""

from __future__ import annotations

import hashlib
import hmac
import os

NONCE_BYTES = 32
DIGEST_BYTES = 32
OK = b"ok"


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def answer(token: bytes, nonce: bytes) -> bytes:
    return hmac.new(token, nonce, hashlib.sha256).digest()


def check(token: bytes, nonce: bytes, digest: bytes) -> bool:
    return len(digest) == DIGEST_BYTES and hmac.compare_digest(answer(token, nonce), digest)


def new_token() -> bytes:
    return os.urandom(32)
