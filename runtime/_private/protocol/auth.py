"""Connection authentication: both ends prove the cluster token (HMAC-SHA256).

```
client                                            server
  | -- client nonce (32 random bytes) + wire version -> |   a server of another wire
  |                                                     |   format refuses with its own
  | <- server nonce (32) + HMAC(token, S|cn|sn) ------- |   the server proves the token
  |    the client checks it; a fake server ends here      |
  | -- HMAC(token, C|cn|sn) --------------------------> |   the client proves the token
  | <- b"ok" ------------------------------------------ |   then msgpack frames both ways
```
Each proof covers both nonces, so a proof seen once opens nothing later, and a
direction label (``S``/``C`` above), so a server's proof sent back to it is not a
client's. Neither side reads anything but these frames before the other has proven
the token; the client checks the server before it reads any other frame. The
RPC connections (``transport.connection``) send them as length-prefixed frames, the
object-transfer data channel (``raylet.object_manager``) as raw bytes.

What this does not do: encrypt or sign the frames that follow. An attacker who sits
on the path between two lumos processes and forwards a live handshake both ways can
then inject frames into that connection; run multi-machine clusters on a network you
trust (or over a VPN).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from typing import Any, Callable

NONCE_BYTES = 32
DIGEST_BYTES = 32
#: The server's answer to a client nonce: its own nonce, then its proof.
SERVER_HELLO_BYTES = NONCE_BYTES + DIGEST_BYTES
OK = b"ok"
_SERVER = b"lumos-auth-v2 server"
_CLIENT = b"lumos-auth-v2 client"


#: The frame encoding and message layouts this lumos speaks (``protocol.codec``): bumped
#: whenever a frame of this version would be misread by a peer of the last one. An RPC
#: client announces it after its nonce; a server of another version refuses it with its
#: own (``version_refusal``), so a driver of one lumos meeting a cluster of another
#: says so at once instead of failing on its first frame.
WIRE_VERSION = 4
_WIRE_TAG = b"lumos-wire"
_REFUSAL_TAG = b"lumos-wire-refused"


def client_hello(client_nonce: bytes) -> bytes:
    """An RPC client's first frame: its nonce and its wire version."""
    return client_nonce + _WIRE_TAG + WIRE_VERSION.to_bytes(2, "big")


def parse_client_hello(payload: bytes) -> tuple[bytes, int | None]:
    """The client nonce and wire version of a client's first frame; version None for a
    lumos from before wire versions (a bare nonce).

    Raises:
        ValueError: the frame is neither.
    """
    if len(payload) == NONCE_BYTES:
        return payload, None
    if len(payload) == NONCE_BYTES + len(_WIRE_TAG) + 2 and payload[NONCE_BYTES:-2] == _WIRE_TAG:
        return payload[:NONCE_BYTES], int.from_bytes(payload[-2:], "big")
    raise ValueError("malformed client hello")


def version_refusal() -> bytes:
    """A server's answer to a client of another wire version: its own version."""
    return _REFUSAL_TAG + WIRE_VERSION.to_bytes(2, "big")


def parse_version_refusal(payload: bytes) -> int | None:
    """The server's wire version when ``payload`` is its refusal, else None."""
    if len(payload) == len(_REFUSAL_TAG) + 2 and payload.startswith(_REFUSAL_TAG):
        return int.from_bytes(payload[-2:], "big")
    return None


def version_mismatch(peer: str, theirs: int | None, me: str = "this process") -> str:
    """What to tell the user when ``peer`` speaks wire version ``theirs`` to ``me``."""
    what = "an older lumos (without wire versions)" if theirs is None else f"lumos wire format {theirs}"
    return (f"{peer} speaks {what}, {me} wire format {WIRE_VERSION}: run the same lumos version "
            "on every node and driver of a cluster (`pip install` the cluster's version)")


def new_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


def _proof(token: bytes, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(token, label + b"\0" + client_nonce + server_nonce, hashlib.sha256).digest()


def server_hello(token: bytes, client_nonce: bytes) -> tuple[bytes, bytes]:
    """The server's reply to ``client_nonce``, and the server nonce it holds on to."""
    server_nonce = new_nonce()
    return server_nonce + _proof(token, _SERVER, client_nonce, server_nonce), server_nonce


def check_server_hello(token: bytes, client_nonce: bytes, hello: bytes) -> bytes | None:
    """The client's check of a server's hello: the server nonce if the proof holds, else None."""
    if len(hello) != SERVER_HELLO_BYTES:
        return None
    server_nonce, digest = hello[:NONCE_BYTES], hello[NONCE_BYTES:]
    if not hmac.compare_digest(_proof(token, _SERVER, client_nonce, server_nonce), digest):
        return None
    return server_nonce


def client_proof(token: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _proof(token, _CLIENT, client_nonce, server_nonce)


def check_client_proof(token: bytes, client_nonce: bytes, server_nonce: bytes, digest: bytes) -> bool:
    return len(digest) == DIGEST_BYTES and hmac.compare_digest(
        _proof(token, _CLIENT, client_nonce, server_nonce), digest)


def client_handshake_blocking(sock: Any, token: bytes, timeout_s: float,
                              recv_exact: Callable[[Any, int, float], bytes], *, unproven: str, refused: str) -> None:
    """The client's side of the handshake on a blocking socket (the transfer port's data
    channel, the client link): check the server's proof before sending ours. ``recv_exact(sock,
    n, deadline)`` reads exactly ``n`` bytes by the monotonic ``deadline``.

    Raises:
        ConnectionError: ``unproven`` when the server did not prove the token, ``refused``
            when it refused ours.
        TimeoutError: the handshake took longer than ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    client_nonce = new_nonce()
    sock.settimeout(timeout_s)
    sock.sendall(client_nonce)
    server_nonce = check_server_hello(token, client_nonce, recv_exact(sock, SERVER_HELLO_BYTES, deadline))
    if server_nonce is None:
        raise ConnectionError(unproven)
    sock.sendall(client_proof(token, client_nonce, server_nonce))
    if recv_exact(sock, len(OK), deadline) != OK:
        raise ConnectionError(refused)


def new_token() -> bytes:
    return os.urandom(32)
