"""Mutual authentication: a fake server or a relay gets no session, on either port.

Every lumos connection starts with the handshake of ``protocol.auth``: the client sends
a nonce, the server proves the cluster token over both nonces, the client checks that
proof before it reads anything else and only then proves the token itself. These
tests stand up fake servers and relays on plain sockets (they know no token) and point
real lumos clients at them: the RPC client (``transport.connection.connect``) and the
object-transfer puller (``object_manager.client_handshake``). They also check that
failed handshakes are logged once per peer address, not once per connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
import struct
import threading
from typing import Any, Iterator

import psutil
import pytest

import lumos
from lumos._private import worker_context
from lumos._private.config import Config
from lumos._private.protocol import auth
from lumos._private.protocol import messages as m
from lumos._private.protocol.framing import HEADER, frame
from lumos._private.raylet.object_manager import client_handshake
from lumos._private.transport.connection import ConnectionLost, PeerWarnings, connect

from ..conftest import lumos_children, running_cluster, wait_for

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def auth_cluster() -> Iterator[dict[str, Any]]:
    for ctx in running_cluster(num_cpus=1, _system_config={"handshake_timeout_s": 1.0}):
        session = ctx.address_info["session_dir"]
        with open(os.path.join(session, "token"), "rb") as f:
            token = f.read().strip()
        host, port = ctx.address_info["gcs_address"].rsplit(":", 1)
        (raylet,) = [p for p in lumos_children() if "lumos._private.raylet.server" in " ".join(p.cmdline())]
        (node,) = lumos.nodes()
        data_ports = [c.laddr.port for c in raylet.net_connections(kind="inet")
                      if c.status == psutil.CONN_LISTEN and c.laddr.port != node["NodeManagerPort"]]
        yield {"session": session, "token": token, "gcs": (host, int(port)), "data": (host, data_ports[0]),
               "raylet_log": os.path.join(session, "logs", f"raylet-{node['NodeID'][:12]}.log")}


# --------------------------------------------------------------------------- helpers


def _read(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def _read_frame(sock: socket.socket) -> bytes:
    (n,) = HEADER.unpack(_read(sock, HEADER.size))
    return _read(sock, n)


def _read_rest(sock: socket.socket, timeout_s: float = 5.0) -> bytes:
    """Everything the peer sends until it closes (or ``timeout_s`` of silence)."""
    sock.settimeout(timeout_s)
    got = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return got
            got += chunk
    except (socket.timeout, ConnectionResetError):
        return got


class FakeServer:
    """A listener that answers each connection with ``serve(sock)`` in a thread."""

    def __init__(self, serve: Any) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = self.listener.getsockname()[:2]
        self.received: list[bytes] = []
        self.errors: list[BaseException] = []
        self._serve = serve
        self._thread = threading.Thread(target=self._run, name="test.fake-server", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sock, _ = self.listener.accept()
        with sock:
            sock.settimeout(10)
            try:
                self._serve(self, sock)
            except BaseException as e:  # reported by the test through ``errors``
                self.errors.append(e)

    def close(self) -> None:
        self.listener.close()
        self._thread.join(10)
        assert not self._thread.is_alive()


def _lumos_connect(address: tuple[str, int], token: bytes, handlers: dict[type, Any]) -> BaseException | None:
    """Run a real lumos client against ``address``; the error it ended with (None: a session)."""
    async def go() -> None:
        conn = await connect(address, token=token, config=Config(handshake_timeout_s=5.0),
                             handlers=handlers, name="test-client", timeout_s=10)
        conn.close()
    try:
        asyncio.run(go())
    except (ConnectionLost, OSError, TimeoutError) as e:
        return e
    return None


@pytest.fixture
def decode_spy(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Every frame payload decoded as msgpack on this thread (where the test's client
    runs; the driver's own connections decode on its ``lumos-io`` thread)."""
    seen: list[bytes] = []
    real = m.decode
    me = threading.get_ident()

    def spy(payload: bytes) -> Any:
        if threading.get_ident() == me:
            seen.append(payload)
        return real(payload)
    monkeypatch.setattr(m, "decode", spy)
    return seen


#: What a fake server sends right after its hello, hoping the client will handle it.
BAIT = frame(m.encode(m.NOTIFY, 0, m.Publish("nodes", b"x", None))) + frame(m.encode(m.REPLY, 1, [1, 2, 3]))


# --------------------------------------------------------------------------- the RPC port


def test_fake_server_gets_no_session_and_the_client_parses_none_of_its_frames(decode_spy):
    handled: list[Any] = []

    def serve(fake: FakeServer, sock: socket.socket) -> None:
        fake.received.append(_read_frame(sock))  # the client's nonce
        sock.sendall(frame(random.Random(3).randbytes(auth.SERVER_HELLO_BYTES)) + frame(auth.OK) + BAIT)
        fake.received.append(_read_rest(sock))

    fake = FakeServer(serve)
    try:
        err = _lumos_connect(fake.address, b"the-real-token-0123456789", {m.Publish: lambda c, b: handled.append(b)})
    finally:
        fake.close()
    assert not fake.errors, fake.errors
    assert isinstance(err, ConnectionLost), err
    nonce, after = fake.received
    assert len(nonce) == len(auth.client_hello(auth.new_nonce()))
    assert after == b"", f"the client answered a fake server: {after!r}"
    assert decode_spy == [] and handled == [], "the client parsed a frame from an unauthenticated server"


def test_fake_server_replaying_a_recorded_hello_gets_no_session(auth_cluster, decode_spy):
    """A hello recorded from the real GCS (for another client's nonce) proves nothing now."""
    with socket.create_connection(auth_cluster["gcs"], timeout=5) as real:
        real.sendall(frame(auth.client_hello(auth.new_nonce())))
        recorded = _read_frame(real)

    def serve(fake: FakeServer, sock: socket.socket) -> None:
        fake.received.append(_read_frame(sock))
        sock.sendall(frame(recorded) + frame(auth.OK) + BAIT)
        fake.received.append(_read_rest(sock))

    fake = FakeServer(serve)
    try:
        err = _lumos_connect(fake.address, auth_cluster["token"], {})
    finally:
        fake.close()
    assert not fake.errors, fake.errors
    assert isinstance(err, ConnectionLost), err
    assert fake.received[1] == b"" and decode_spy == []


def test_relay_that_rides_the_real_servers_hello_gets_no_session(auth_cluster, decode_spy):
    """The relay opens a connection to the real GCS with a nonce of its own, shows the
    GCS's hello to a real client, and forwards whatever the client answers to the GCS.
    The client refuses the hello (it was not made for its nonce) and answers nothing, so
    the GCS never accepts the relay."""
    gcs_got: list[bytes] = []

    def serve(fake: FakeServer, sock: socket.socket) -> None:
        with socket.create_connection(auth_cluster["gcs"], timeout=5) as real:
            real.sendall(frame(auth.client_hello(auth.new_nonce())))
            hello = _read_frame(real)
            fake.received.append(_read_frame(sock))  # the client's nonce: too late to use
            sock.sendall(frame(hello))
            answer = _read_rest(sock)
            fake.received.append(answer)
            if answer:
                real.sendall(answer)
            gcs_got.append(_read_rest(real))

    fake = FakeServer(serve)
    try:
        err = _lumos_connect(fake.address, auth_cluster["token"], {})
    finally:
        fake.close()
    assert not fake.errors, fake.errors
    assert isinstance(err, ConnectionLost), err
    assert fake.received[1] == b"", "the client answered a hello that was not made for its nonce"
    assert gcs_got == [b""], f"the GCS told the relay: {gcs_got!r}"
    assert decode_spy == []


def test_servers_proof_cannot_be_reflected_to_another_connection(auth_cluster):
    """Two connections to the GCS: its proof on one is not a client proof on the other,
    even when the relay picks the nonces (direction labels)."""
    with socket.create_connection(auth_cluster["gcs"], timeout=5) as a, \
            socket.create_connection(auth_cluster["gcs"], timeout=5) as b:
        cn_b = auth.new_nonce()
        b.sendall(frame(auth.client_hello(cn_b)))
        sn_b = _read_frame(b)[:auth.NONCE_BYTES]
        # On ``a`` the relay offers nonce ``cn_b``; the GCS proves over (cn_b, sn_a), never sn_b.
        a.sendall(frame(auth.client_hello(cn_b)))
        proof_a = _read_frame(a)[auth.NONCE_BYTES:]
        b.sendall(frame(proof_a))
        assert auth.OK not in _read_rest(b)
        assert sn_b  # used above; the proof covers a different server nonce and the other label


# --------------------------------------------------------------------------- the data channel


def test_fake_data_channel_gets_no_proof_and_no_request():
    def serve(fake: FakeServer, sock: socket.socket) -> None:
        fake.received.append(_read(sock, auth.NONCE_BYTES))
        # A hello that proves nothing, an "ok", and bytes the puller would write into the store.
        sock.sendall(random.Random(4).randbytes(auth.SERVER_HELLO_BYTES) + auth.OK + struct.pack("<q", 4) + b"evil")
        fake.received.append(_read_rest(sock))

    fake = FakeServer(serve)
    try:
        with socket.create_connection(fake.address, timeout=5) as sock:
            with pytest.raises(ConnectionError, match="did not prove"):
                client_handshake(sock, b"the-real-token-0123456789", 5.0)
    finally:
        fake.close()
    assert not fake.errors, fake.errors
    assert fake.received[1] == b"", f"the puller answered a fake holder: {fake.received[1]!r}"


def test_data_channel_relay_of_a_recorded_hello_gets_no_session(auth_cluster):
    with socket.create_connection(auth_cluster["data"], timeout=5) as real:
        real.sendall(auth.new_nonce())
        recorded = _read(real, auth.SERVER_HELLO_BYTES)

    def serve(fake: FakeServer, sock: socket.socket) -> None:
        fake.received.append(_read(sock, auth.NONCE_BYTES))
        sock.sendall(recorded + auth.OK)
        fake.received.append(_read_rest(sock))

    fake = FakeServer(serve)
    try:
        with socket.create_connection(fake.address, timeout=5) as sock:
            with pytest.raises(ConnectionError, match="did not prove"):
                client_handshake(sock, auth_cluster["token"], 5.0)
    finally:
        fake.close()
    assert fake.received[1] == b""


def test_data_channel_refuses_a_reflected_proof(auth_cluster):
    with socket.create_connection(auth_cluster["data"], timeout=5) as sock:
        sock.sendall(auth.new_nonce())
        hello = _read(sock, auth.SERVER_HELLO_BYTES)
        sock.sendall(hello[auth.NONCE_BYTES:])
        assert _read_rest(sock) == b""


def test_real_data_channel_handshake_is_accepted(auth_cluster):
    """The control: the puller's handshake with the right token."""
    with socket.create_connection(auth_cluster["data"], timeout=5) as sock:
        client_handshake(sock, auth_cluster["token"], 5.0)
        sock.sendall(bytes([20]) + b"\x07" * 20 + struct.pack("<QQ", 0, 1))
        assert struct.unpack("<q", _read(sock, 8)) == (-1,)  # no such object, and still served


# --------------------------------------------------------------------------- rate-limited warnings


def test_peer_warnings_log_one_line_per_address_per_interval(caplog):
    caplog.set_level(logging.WARNING)
    log = logging.getLogger("test.peer_warnings")
    w = PeerWarnings()
    assert w.warn(log, "10.0.0.1", 60.0, "dropping %s", "a")
    for _ in range(5):
        assert not w.warn(log, "10.0.0.1", 60.0, "dropping %s", "a")
    assert w.warn(log, "10.0.0.2", 60.0, "dropping %s", "b")
    assert [r.getMessage() for r in caplog.records] == ["dropping a", "dropping b"]
    assert w.warn(log, "10.0.0.1", 0.0, "dropping %s", "a")  # the interval has passed
    assert caplog.records[-1].getMessage() == "dropping a (5 more from this address since the last line)"


def _bad_handshake(address: tuple[str, int], source: str, framed: bool) -> None:
    with socket.create_connection(address, timeout=5, source_address=(source, 0)) as sock:
        sock.sendall(frame(auth.client_hello(auth.new_nonce())) if framed else auth.new_nonce())
        if framed:
            _read_frame(sock)
            sock.sendall(frame(b"x" * auth.DIGEST_BYTES))
        else:
            _read(sock, auth.SERVER_HELLO_BYTES)
            sock.sendall(b"x" * auth.DIGEST_BYTES)
        assert auth.OK not in _read_rest(sock)


def _lines_with(path: str, text: str) -> int:
    with open(path, errors="replace") as f:
        return sum(1 for line in f if text in line)


@pytest.mark.parametrize("port", ["gcs", "data"])
def test_failed_handshakes_are_logged_once_per_address(auth_cluster, port):
    """Ten failed handshakes from one address: one log line. Another address: its own line."""
    log = os.path.join(auth_cluster["session"], "logs", "gcs.log") if port == "gcs" else auth_cluster["raylet_log"]
    first, second = ("127.0.0.3", "127.0.0.4") if port == "gcs" else ("127.0.0.5", "127.0.0.6")
    quoted = "'{}'" if port == "gcs" else "peer {} "
    for _ in range(10):
        _bad_handshake(auth_cluster[port], first, framed=port == "gcs")
    _bad_handshake(auth_cluster[port], second, framed=port == "gcs")
    wait_for(lambda: _lines_with(log, quoted.format(second)) == 1, 10)
    assert _lines_with(log, quoted.format(first)) == 1
    assert lumos.get(lumos.put(5), timeout=30) == 5
    assert worker_context.core_worker is not None
