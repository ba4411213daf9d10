"""Messages of the client link (``lumos://``): framing, payload layout, the handshake.

The link is one TCP connection between a client process and its session on the head,
authenticated both ways with the cluster token (``protocol.auth``, as raw bytes, the
handshake of the object-transfer data channel). Then messages flow both ways:

```
 u32 length | msgpack control map {"op", "id", ..., "segs": [[offset, length]...], "total": n}
 segment bytes, in order (no framing: the control map gave their lengths)
```
The segments are the payload: serialized values (``serialization``'s blob layout,
64-byte aligned), which the receiver ``recv_into``s straight into one buffer of
``total`` bytes at their offsets, so a value received is deserialized zero-copy from
where it landed (numpy arrays are views of that buffer). The sender writes the
out-of-band buffers straight from the value's memory (``sendall`` of each view).

Blocking sockets with one reader thread per link, like the transfer data channel: a
100 MiB value then crosses with no copy through Python objects on either side.
"""

from __future__ import annotations

import mmap
import socket
import time
from typing import Any

import msgpack

from lumos._private import serialization as ser
from lumos._private.protocol import auth
from lumos._private.protocol.framing import HEADER, ProtocolError

#: Control maps larger than this close the link.
MAX_CONTROL_BYTES = 64 << 20
#: Payloads above this close the link (checked before allocating).
MAX_PAYLOAD_BYTES = 1 << 40
#: Payloads from this size land in an anonymous mapping (no up-front zeroing).
_MAP_FROM_BYTES = 1 << 20
#: Large segments are written in pieces of this size (see ``send``).
_SEND_CHUNK_BYTES = 4 << 20


def recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray(n)
    recv_into(sock, memoryview(buf), deadline)
    return bytes(buf)


def recv_into(sock: socket.socket, view: memoryview, deadline: float | None = None) -> None:
    got, n = 0, view.nbytes
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the client link timed out mid-message")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("the peer closed the client link")
        got += k


def server_handshake(sock: socket.socket, token: bytes, timeout_s: float) -> None:
    """The head's side of the handshake: prove the token, then check the client's proof.

    Raises:
        ConnectionError: the client's proof is wrong, or it went away.
        TimeoutError: not done within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    client_nonce = recv_exact(sock, auth.NONCE_BYTES, deadline)
    hello, server_nonce = auth.server_hello(token, client_nonce)
    sock.sendall(hello)
    if not auth.check_client_proof(token, client_nonce, server_nonce, recv_exact(sock, auth.DIGEST_BYTES, deadline)):
        raise ConnectionError("the client did not prove the cluster token")
    sock.sendall(auth.OK)


def client_handshake(sock: socket.socket, token: bytes, timeout_s: float) -> None:
    """The client's side: check the head's proof first, then prove the token."""
    auth.client_handshake_blocking(
        sock, token, timeout_s, recv_exact,
        unproven="the server did not prove it holds the cluster token (wrong token, or not the "
                 "lumos client server of this cluster)",
        refused="the lumos head refused the cluster token")


class Payload:
    """Serialized values laid out one after another (each 64-byte aligned) for one message."""

    __slots__ = ("segments", "blobs", "total")

    def __init__(self) -> None:
        #: (offset, bytes-like) in offset order: what goes on the wire.
        self.segments: list[tuple[int, Any]] = []
        #: (offset, length) of each value's blob.
        self.blobs: list[tuple[int, int]] = []
        self.total = 0

    def add(self, sv: ser.SerializedValue) -> None:
        base = (self.total + ser.ALIGN - 1) & ~(ser.ALIGN - 1)
        self.segments.append((base, sv._header() + sv.pickled))
        for off, buf in zip(sv._offsets, sv.buffers):
            if buf.nbytes:
                self.segments.append((base + off, buf))
        self.blobs.append((base, sv.total_size))
        self.total = base + sv.total_size

    def control(self) -> dict[str, Any]:
        return {"segs": [[off, _nbytes(seg)] for off, seg in self.segments], "blobs": self.blobs,
                "total": self.total}


def _nbytes(seg: Any) -> int:
    return seg.nbytes if isinstance(seg, memoryview) else len(seg)


def send(sock: socket.socket, control: dict[str, Any], payload: Payload | None = None) -> None:
    """Write one message (the caller holds the link's send lock)."""
    if payload is not None and payload.segments:
        control.update(payload.control())
    body = msgpack.packb(control, use_bin_type=True)
    if payload is None or not payload.segments:
        sock.sendall(HEADER.pack(len(body)) + body)
        return
    sock.sendall(HEADER.pack(len(body)) + body)
    for _, seg in payload.segments:
        view = memoryview(seg).cast("B")
        # The socket's timeout bounds one sendall as a whole: in chunks, it bounds a
        # stall rather than the time a large value takes on a slow link.
        for off in range(0, view.nbytes, _SEND_CHUNK_BYTES):
            sock.sendall(view[off:off + _SEND_CHUNK_BYTES])


def recv(sock: socket.socket) -> tuple[dict[str, Any], memoryview | None]:
    """Read one message: its control map and its payload buffer (None without one).

    Raises:
        ProtocolError: malformed or oversized message.
        ConnectionError / OSError / TimeoutError: the link broke (or went silent past
            the socket's timeout).
    """
    (n,) = HEADER.unpack(recv_exact(sock, HEADER.size))
    if n > MAX_CONTROL_BYTES:
        raise ProtocolError(f"control message of {n} bytes exceeds {MAX_CONTROL_BYTES}")
    try:
        control = msgpack.unpackb(recv_exact(sock, n), raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise ProtocolError(f"bad control message: {e}") from None
    if not isinstance(control, dict) or "op" not in control:
        raise ProtocolError("control message is not a map with an op")
    total = control.get("total", 0)
    if not total:
        return control, None
    if not isinstance(total, int) or total < 0 or total > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"payload of {total!r} bytes refused")
    buf: Any = mmap.mmap(-1, total) if total >= _MAP_FROM_BYTES else bytearray(total)
    view = memoryview(buf)
    for off, length in control.get("segs", ()):
        if not (isinstance(off, int) and isinstance(length, int) and 0 <= off and length >= 0
                and off + length <= total):
            raise ProtocolError("payload segment out of range")
        recv_into(sock, view[off:off + length])
    return control, view


def blobs_of(control: dict[str, Any], payload: memoryview | None) -> list[memoryview]:
    """The serialized values of a received message, as views of its payload buffer."""
    if payload is None:
        return []
    out = []
    for off, length in control.get("blobs", ()):
        if not (isinstance(off, int) and isinstance(length, int) and 0 <= off and off + length <= payload.nbytes):
            raise ProtocolError("payload blob out of range")
        out.append(payload[off:off + length])
    return out
