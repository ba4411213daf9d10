"""The client server on the head: admits ``lumos://`` clients and hands each to its session.

Started by ``lumos start --head`` (``python -m lumos._private.client.server``), bound to
the node IP the user asked for (127.0.0.1 by default). Per connection, in a thread:

```
accept ─► handshake (cluster token, both ways, deadline) ─► hello {client_id, resume, ...}
   new client       ─► start its session process (socketpair) ─► send (fd, hello)
   known, alive     ─► send (fd, hello) to its session (a reconnect)
   resume, unknown  ─► {"op": "error"}: its session ended (grace passed, or the head restarted)
```
The session answers the client itself (``welcome``) on the handed-over socket; nothing
here reads past the hello. Sessions die with this process (PDEATHSIG) and are stopped
with it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import msgpack

from lumos._private.client import wire
from lumos._private.protocol import auth
from lumos._private.protocol.framing import ProtocolError

logger = logging.getLogger(__name__)

#: Connections in their handshake at once; more are closed at accept.
MAX_PENDING_HANDSHAKES = 64


class _Session:
    __slots__ = ("client_id", "proc", "ctrl")

    def __init__(self, client_id: str, proc: subprocess.Popen[bytes], ctrl: socket.socket) -> None:
        self.client_id = client_id
        self.proc = proc
        #: Our end of the SOCK_SEQPACKET pair; the session reads (fd, hello) from the other.
        self.ctrl = ctrl


class ClientServer:
    """Accepts client connections and routes them to per-client session processes."""

    def __init__(self, host: str, port: int, token: bytes, gcs_address: str, token_file: str, session_dir: str,
                 config_json: str, handshake_timeout_s: float, gcs_public_address: str = "") -> None:
        self.token = token
        self.gcs_address = gcs_address
        self.gcs_public_address = gcs_public_address or gcs_address
        self.token_file = token_file
        self.session_dir = session_dir
        self.config_json = config_json
        self.handshake_timeout_s = handshake_timeout_s
        self.listener = socket.create_server((host, port), backlog=128)
        self.host, self.port = self.listener.getsockname()[:2]
        #: Client id (hex) -> its session.
        self.sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._pending = threading.BoundedSemaphore(MAX_PENDING_HANDSHAKES)
        self._stopping = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._accept_loop, name="client_server.accept", daemon=True).start()
        threading.Thread(target=self._reap_loop, name="client_server.reap", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, addr = self.listener.accept()
            except OSError:
                if self._stopping.is_set():
                    return
                time.sleep(0.1)
                continue
            if not self._pending.acquire(blocking=False):
                conn.close()
                logger.warning("too many client handshakes in progress; refused %s", addr[0])
                continue
            threading.Thread(target=self._admit, args=(conn, addr[0]), name="client_server.admit",
                             daemon=True).start()

    def _admit(self, conn: socket.socket, peer: str) -> None:
        handed = False
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            wire.server_handshake(conn, self.token, self.handshake_timeout_s)
            conn.settimeout(self.handshake_timeout_s)
            hello, _ = wire.recv(conn)
            if hello.get("op") != "hello" or not isinstance(hello.get("client_id"), str):
                raise ProtocolError("the first message is not a hello")
            theirs = hello.get("wire")
            if theirs != auth.WIRE_VERSION:
                # A client of another lumos: its pickled templates and refs would be misread.
                theirs = theirs if type(theirs) is int else None
                wire.send(conn, {"op": "error", "message": auth.version_mismatch("this client", theirs,
                                                                                 "the lumos head")})
                raise ProtocolError(auth.version_mismatch("the client", theirs))
            handed = self._route(conn, hello)
        except (ProtocolError, ConnectionError, TimeoutError, OSError) as e:
            logger.warning("client connection from %s refused: %s", peer, e or type(e).__name__)
        finally:
            self._pending.release()
            conn.close()  # the session holds its own copy of a handed-over socket
        if handed:
            logger.info("client %s from %s handed to its session", hello["client_id"][:8], peer)

    def _route(self, conn: socket.socket, hello: dict[str, Any]) -> bool:
        cid = hello["client_id"]
        data = msgpack.packb(hello, use_bin_type=True)
        with self._lock:
            s = self.sessions.get(cid)
            if s is not None and s.proc.poll() is None:
                try:
                    socket.send_fds(s.ctrl, [data], [conn.fileno()])
                    return True
                except OSError:
                    pass
            if hello.get("resume"):
                wire.send(conn, {"op": "error", "message": "the session of this client has ended (it was away "
                                 "longer than the head's client_reconnect_grace_s, or the head restarted); "
                                 "its objects and actors are gone: call lumos.shutdown() and lumos.init() again"})
                return False
            s = self._spawn(cid)
            self.sessions[cid] = s
            socket.send_fds(s.ctrl, [data], [conn.fileno()])
            return True

    def _spawn(self, cid: str) -> _Session:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = open(os.path.join(self.session_dir, "logs", f"client-{cid[:8]}.out"), "ab")
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "lumos._private.client.session", "--ctrl-fd", str(theirs.fileno()),
                 "--client-id", cid, "--gcs-address", self.gcs_address,
                 "--gcs-public-address", self.gcs_public_address, "--token-file", self.token_file,
                 "--session-dir", self.session_dir, "--config", self.config_json,
                 "--die-with-parent", str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(theirs.fileno(),),
                close_fds=True, start_new_session=True)
        finally:
            theirs.close()
            log.close()
        logger.info("client %s: started its session (pid %d)", cid[:8], proc.pid)
        return _Session(cid, proc, ours)

    def _reap_loop(self) -> None:
        while not self._stopping.wait(1.0):
            with self._lock:
                for cid, s in list(self.sessions.items()):
                    code = s.proc.poll()
                    if code is not None:
                        logger.info("client %s: its session ended (exit code %s)", cid[:8], code)
                        s.ctrl.close()
                        del self.sessions[cid]

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stopping.set()
        self.listener.close()
        with self._lock:
            sessions = list(self.sessions.values())
            self.sessions.clear()
        for s in sessions:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for s in sessions:
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(5)
            s.ctrl.close()


def main() -> None:
    from lumos._private.config import Config
    from lumos._private.process import die_with_parent, read_token, report_ready, setup_logging
    p = argparse.ArgumentParser(prog="lumos-client-server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=10001)
    p.add_argument("--gcs-address", required=True, help="how sessions reach the GCS (its unix: socket)")
    p.add_argument("--gcs-public-address", default="", help="the GCS's HOST:PORT, as clients are told")
    p.add_argument("--token-file", required=True)
    p.add_argument("--session-dir", required=True)
    p.add_argument("--config", default="{}")
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent, signal.SIGTERM)
    setup_logging(os.path.join(args.session_dir, "logs"), "client_server")
    config = Config.resolve(json.loads(args.config))
    server = ClientServer(args.host, args.port, read_token(args.token_file), args.gcs_address, args.token_file,
                          args.session_dir, args.config, config.connect_timeout_s, args.gcs_public_address)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    server.start()
    logger.info("client server listening on %s:%d", server.host, server.port)
    report_ready(args.ready_fd, {"host": server.host, "port": server.port})
    while not stop.wait(1.0):
        pass
    server.stop()


if __name__ == "__main__":
    main()
