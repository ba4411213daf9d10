"""Object transfer between nodes: a raylet pulls a sealed object from another raylet.

```
worker ──PullObject(id, from_node)──► local raylet (ObjectManager)
                                        │ one pull per object; later askers wait on it
                                        ├─GetObjectSize──────────► holder raylet
                                        ├─ReadObjectChunk × N ───► holder raylet (pread in a thread)
                                        │   (CHUNK_BYTES each, MAX_CHUNKS_IN_FLIGHT at once)
                                        └─ create in the local store, write chunks (threads), seal
```
Chunks travel on a separate data channel: a plain TCP listener, authenticated both
ways with the same handshake as every lumos connection (``protocol.auth``, as raw
bytes), where the holder
``sendfile``s straight from its ``/dev/shm`` file and the puller ``recv_into``s straight
into the mapped destination (no copies through Python objects). ``ReadObjectChunk``
over the RPC connection remains for peers without that channel.

```
accept thread (one selector)                          serving threads (<= MAX_DATA_CONNECTIONS)
  accept ─► handshake, non-blocking, one deadline ─► authenticated socket ─► requests, sendfile
            at most MAX_UNAUTHENTICATED_PER_ADDRESS per peer address (the oldest goes)
```
A peer that never finishes its handshake holds one file descriptor until its deadline,
never a thread, and crowds out only other handshakes from its own address.

After the pull the object is an ordinary sealed file in this node's store: readers map
it zero-copy. A holder serves a spilled object straight from its spill file (no restore);
a puller whose store is smaller than the object writes it into its own spill directory. Frees reach the copies through ``FreeObjectCopies``, which the raylet
that hears a free from an owner sends to every other alive raylet. A copy is a cache
(evicted first under pressure) until the node of its object's primary dies: the owner,
told of the copy by its reader (``ObjectCopied``), then has it kept as the primary
(``KeepObjectCopies``, ``core_worker/copies.py``).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import struct
import selectors
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lumos._private.protocol import auth

from lumos._private.ids import NodeID, ObjectID, short
from lumos._private.object_store.client import open_object_file
from lumos._private.object_store.store_state import PULLED
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError, connect, peer_warnings

logger = logging.getLogger(__name__)

CHUNK_BYTES = 8 * 1024 * 1024
MAX_CHUNKS_IN_FLIGHT = 4
#: Data-channel streams per pull (each a TCP connection carrying one byte range).
STREAMS_PER_PULL = 4
#: Below this, one stream.
MIN_STREAM_BYTES = 4 * 1024 * 1024
#: Authenticated data-channel connections a raylet serves at once (a thread each).
MAX_DATA_CONNECTIONS = 64
#: Handshakes in progress from one peer address; a newer one drops the oldest.
MAX_UNAUTHENTICATED_PER_ADDRESS = 8
#: Handshakes in progress from all addresses together; beyond it the oldest goes.
MAX_UNAUTHENTICATED = 256
_REQ = struct.Struct("<QQ")
_LEN = struct.Struct("<q")


class ObjectUnavailable(Exception):
    """The object cannot be pulled (its node is gone, or it no longer holds it)."""


class ObjectManager:
    """Pulls objects into this node's store and serves chunks of local ones to peers."""

    def __init__(self, raylet: Any) -> None:
        self.raylet = raylet
        #: Object id -> the one pull in progress for it.
        self._pulls: dict[bytes, asyncio.Future[None]] = {}
        #: Node id -> connection to that node's raylet (TCP).
        self._peers: dict[bytes, Connection] = {}
        #: Data-channel sockets of pulls in progress, by the node pulled from (transfer
        #: threads add and remove theirs): a node declared dead has them shut at once.
        self._streams: dict[bytes, set[socket.socket]] = {}
        self._streams_lock = threading.Lock()
        self._connecting: dict[bytes, asyncio.Future[Connection]] = {}
        self._io = ThreadPoolExecutor(16, thread_name_prefix="raylet.transfer")
        #: Authenticated data-channel connections served at once (a thread each); more
        #: wait for a thread. Peers that have not authenticated never get one.
        self._serving = threading.BoundedSemaphore(MAX_DATA_CONNECTIONS)
        self._listener: socket.socket | None = None
        #: Port of the data channel (0 until ``start``).
        self.data_port = 0
        self._closing = False
        #: Transfer counters, for stats and tests.
        self.bytes_pulled = 0
        self.bytes_served = 0
        self.pulls_done = 0

    def start(self, host: str) -> None:
        """Open the data channel on ``host`` (an ephemeral port), served by threads."""
        self._listener = socket.create_server((host, 0))
        self.data_port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept_loop, name="raylet.transfer-accept", daemon=True).start()

    def close(self) -> None:
        self._closing = True
        for conn in self._peers.values():
            conn.close()
        self._peers.clear()
        if self._listener is not None:
            try:
                self._listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self._listener.close()
        self._io.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ data channel (threads)

    def _accept_loop(self) -> None:
        """Thread: accept peers and run their handshakes on one selector, without blocking."""
        assert self._listener is not None
        self._listener.setblocking(False)
        sel = selectors.DefaultSelector()
        sel.register(self._listener, selectors.EVENT_READ, None)
        #: Handshakes in progress, oldest first.
        pending: dict[socket.socket, _Handshake] = {}
        try:
            while not self._closing:
                now = time.monotonic()
                timeout = min((h.deadline for h in pending.values()), default=now + 1.0) - now
                try:
                    events = sel.select(max(0.0, min(timeout, 1.0)))
                except OSError:
                    return
                for key, _ in events:
                    if key.data is None:
                        if not self._accept_one(sel, pending):
                            return
                    else:
                        self._handshake_step(sel, pending, key.data)
                now = time.monotonic()
                for h in [h for h in pending.values() if h.deadline <= now]:
                    self._end_handshake(sel, pending, h, "did not authenticate before the handshake deadline")
        finally:
            for h in list(pending.values()):
                self._end_handshake(sel, pending, h, None)
            sel.close()

    def _accept_one(self, sel: selectors.BaseSelector, pending: dict[socket.socket, "_Handshake"]) -> bool:
        assert self._listener is not None
        try:
            sock, addr = self._listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return True
        except OSError:
            return False  # the listener closed
        host = str(addr[0])
        h = _Handshake(sock, host, time.monotonic() + self.raylet.config.handshake_timeout_s)
        same = [o for o in pending.values() if o.host == host]
        if len(same) >= MAX_UNAUTHENTICATED_PER_ADDRESS:
            self._end_handshake(sel, pending, same[0], "too many unauthenticated connections from one address")
        elif len(pending) >= MAX_UNAUTHENTICATED:
            self._end_handshake(sel, pending, next(iter(pending.values())), "too many unauthenticated connections")
        sock.setblocking(False)
        pending[sock] = h
        sel.register(sock, selectors.EVENT_READ, h)
        return True

    def _handshake_step(self, sel: selectors.BaseSelector, pending: dict[socket.socket, "_Handshake"],
                        h: "_Handshake") -> None:
        try:
            # Both steps read 32 bytes (a nonce, then a proof); never more than the step needs.
            data = h.sock.recv(auth.NONCE_BYTES - len(h.buf))
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._end_handshake(sel, pending, h, f"did not authenticate ({e})")
            return
        if not data:
            self._end_handshake(sel, pending, h, "closed the connection during the handshake")
            return
        h.buf += data
        token = self.raylet.token
        try:
            if h.server_nonce is None and len(h.buf) == auth.NONCE_BYTES:
                h.client_nonce = bytes(h.buf)
                hello, h.server_nonce = auth.server_hello(token, h.client_nonce)
                h.buf.clear()
                h.sock.sendall(hello)  # 64 bytes into an empty send buffer: never blocks
            elif h.server_nonce is not None and len(h.buf) == auth.DIGEST_BYTES:
                if not auth.check_client_proof(token, h.client_nonce, h.server_nonce, bytes(h.buf)):
                    self._end_handshake(sel, pending, h, "failed authentication (wrong cluster token?)")
                    return
                h.sock.sendall(auth.OK)
                sel.unregister(h.sock)
                del pending[h.sock]
                self._start_serving(h.sock)
        except OSError as e:
            self._end_handshake(sel, pending, h, f"did not authenticate ({e})")

    def _end_handshake(self, sel: selectors.BaseSelector, pending: dict[socket.socket, "_Handshake"],
                       h: "_Handshake", reason: str | None) -> None:
        pending.pop(h.sock, None)
        try:
            sel.unregister(h.sock)
        except (KeyError, ValueError):
            pass
        h.sock.close()
        if reason is not None:
            peer_warnings.warn(logger, h.host, self.raylet.config.peer_warning_interval_s,
                               "data channel: peer %s %s; dropped", h.host, reason)

    def _start_serving(self, sock: socket.socket) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.raylet.config.rpc_timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve_data, args=(sock,), name="raylet.transfer-serve",
                             daemon=True).start()
        except (OSError, RuntimeError) as e:  # no thread could be started: drop this peer, keep serving
            logger.warning("data channel: cannot serve an authenticated peer: %s", e)
            sock.close()

    def _serve_data(self, sock: socket.socket) -> None:
        with self._serving:
            try:
                self._serve_data_on(sock)
            finally:
                sock.close()

    def _serve_data_on(self, sock: socket.socket) -> None:
        try:
            while True:
                head = sock.recv(1)
                if not head:
                    return
                n = head[0]
                if n > 64:
                    logger.warning("data channel: bad request; dropped")
                    return
                object_id = _recv_exact(sock, n)
                offset, length = _REQ.unpack(_recv_exact(sock, _REQ.size))
                self._send_range(sock, object_id, offset, length)
        except (OSError, ConnectionError) as e:
            logger.debug("data channel connection ended: %s", e)

    def _open_object(self, object_id: ObjectID) -> int:
        """A read-only fd of a local object: its store file, else its spill file (a spilled
        object is served from disk, without a restore). Any thread."""
        store = self.raylet.store
        try:
            return os.open(store.final_path(object_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            if not store.spill_dir:
                raise
            return os.open(store.spill_path(object_id), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def _send_range(self, sock: socket.socket, object_id: ObjectID, offset: int, length: int) -> None:
        try:
            f = os.fdopen(self._open_object(object_id), "rb")
        except OSError:
            sock.sendall(_LEN.pack(-1))
            return
        with f:
            if offset + length > os.fstat(f.fileno()).st_size:
                sock.sendall(_LEN.pack(-1))
                return
            sock.sendall(_LEN.pack(length))
            # socket.sendfile copes with the timeout (non-blocking fd) that os.sendfile does not.
            if sock.sendfile(f, offset, length) != length:
                raise ConnectionError("peer stopped reading")
            self.bytes_served += length

    def _fetch_range(self, from_node: NodeID, host: str, port: int, object_id: ObjectID, mm: mmap.mmap,
                     offset: int, length: int) -> None:
        """Thread: one stream of a pull, received straight into the destination mapping."""
        config = self.raylet.config
        with socket.create_connection((host, port), timeout=config.connect_timeout_s) as sock:
            with self._streams_lock:
                if from_node not in self.raylet.alive_nodes:
                    raise ConnectionError(f"node {short(from_node)} was declared dead")
                self._streams.setdefault(from_node, set()).add(sock)
            try:
                self._receive_range(sock, object_id, mm, offset, length)
            finally:
                with self._streams_lock:
                    mine = self._streams.get(from_node)
                    if mine is not None:
                        mine.discard(sock)
                        if not mine:
                            del self._streams[from_node]

    def _receive_range(self, sock: socket.socket, object_id: ObjectID, mm: mmap.mmap, offset: int,
                       length: int) -> None:
        """Thread: authenticate on ``sock``, ask for the range, receive it into ``mm``."""
        config = self.raylet.config
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client_handshake(sock, self.raylet.token, config.handshake_timeout_s)
        sock.settimeout(config.rpc_timeout_s)
        sock.sendall(bytes([len(object_id)]) + object_id + _REQ.pack(offset, length))
        (n,) = _LEN.unpack(_recv_exact(sock, _LEN.size))
        if n != length:
            raise ObjectUnavailable(f"holder no longer has object {object_id.hex()}")
        with memoryview(mm) as whole, whole[offset:offset + length] as view:
            got = 0
            while got < length:
                with view[got:] as rest:
                    k = sock.recv_into(rest, length - got)
                if k == 0:
                    raise ConnectionError("holder closed the data channel mid-object")
                got += k

    # ------------------------------------------------------------------ pulling

    async def pull(self, object_id: ObjectID, from_node: NodeID) -> None:
        """Return once ``object_id`` is sealed in this node's store (pulling it if needed)."""
        if self._have(object_id):
            return
        fut = self._pulls.get(object_id)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._pulls[object_id] = fut
            self.raylet._spawn(self._run_pull(object_id, from_node, fut), f"raylet.pull.{short(object_id)}")
        await asyncio.shield(fut)

    def _have(self, object_id: ObjectID) -> bool:
        obj = self.raylet.store.objects.get(object_id)
        return obj is not None and obj.sealed

    async def _run_pull(self, object_id: ObjectID, from_node: NodeID, fut: asyncio.Future[None]) -> None:
        try:
            await self._pull_once(object_id, from_node)
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e if isinstance(e, Exception) else ObjectUnavailable("pull cancelled"))
                fut.exception()
            if not isinstance(e, Exception):
                raise
        else:
            if not fut.done():
                fut.set_result(None)
        finally:
            self._pulls.pop(object_id, None)

    async def _pull_once(self, object_id: ObjectID, from_node: NodeID) -> None:
        if from_node == self.raylet.node_id:
            raise ObjectUnavailable(f"object {object_id.hex()} should be on this node, but its file is gone")
        try:
            conn = await self._peer(from_node)
            answer = await conn.call(m.GetObjectSize(object_id), self.raylet.config.rpc_timeout_s)
        except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
            raise ObjectUnavailable(f"node {short(from_node)} holding object {object_id.hex()} is unreachable: {e}") \
                from None
        size, data_port = (answer[0], answer[1]) if isinstance(answer, list) else (answer, 0)
        if size < 0:
            raise ObjectUnavailable(f"node {short(from_node)} no longer holds object {object_id.hex()}")
        info = self.raylet.alive_nodes.get(from_node)
        host = info.address.host if info is not None else ""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        slot, path, final_path, file_size, reused = await self.raylet.create_local(object_id, size, PULLED)
        ok = False
        try:
            mm = await loop.run_in_executor(self._io, _open_for_write, path, file_size, reused)
            try:
                if data_port and host:
                    streams = max(1, min(STREAMS_PER_PULL, size // MIN_STREAM_BYTES))
                    step = -(-size // streams)
                    # Every stream finishes (or fails) before the mapping closes: a stream
                    # still writing would make close() fail and hide the real error.
                    results = await asyncio.gather(*(
                        loop.run_in_executor(self._io, self._fetch_range, from_node, host, data_port, object_id,
                                             mm, off, min(step, size - off))
                        for off in range(0, size, step)), return_exceptions=True)
                    for r in results:
                        if isinstance(r, BaseException):
                            raise r
                    return_early = True
                else:
                    return_early = False
                sem = asyncio.Semaphore(MAX_CHUNKS_IN_FLIGHT)

                async def one(offset: int) -> None:
                    async with sem:
                        length = min(CHUNK_BYTES, size - offset)
                        data = await conn.call(m.ReadObjectChunk(object_id, offset, length),
                                               self.raylet.config.rpc_timeout_s)
                        if not isinstance(data, bytes) or len(data) != length:
                            raise ObjectUnavailable(f"node {short(from_node)} sent a bad chunk of {object_id.hex()}")
                        await loop.run_in_executor(self._io, _write, mm, offset, data)

                if not return_early:
                    await asyncio.gather(*(one(off) for off in range(0, size, CHUNK_BYTES)))
            finally:
                mm.close()
            os.rename(path, final_path)
            ok = True
        except (ConnectionLost, TimeoutError, RemoteError, OSError, ConnectionError) as e:
            raise ObjectUnavailable(f"pulling object {object_id.hex()} from node {short(from_node)} failed: {e}") \
                from None
        finally:
            if ok:
                self.raylet.seal_local(object_id, size)
                self.bytes_pulled += size
                self.pulls_done += 1
            else:
                self.raylet.abort_local(object_id)
        logger.info("pulled %s (%d bytes) from %s in %.3fs", short(object_id), size, short(from_node),
                    loop.time() - t0)

    async def peer(self, node_id: NodeID) -> Connection:
        """The shared connection to ``node_id``'s raylet (opened if need be); raises
        ``ObjectUnavailable`` when that node is not alive."""
        return await self._peer(node_id)

    async def _peer(self, node_id: NodeID) -> Connection:
        conn = self._peers.get(node_id)
        if conn is not None and not conn.is_closed:
            return conn
        pending = self._connecting.get(node_id)
        if pending is not None:
            return await asyncio.shield(pending)
        info = self.raylet.alive_nodes.get(node_id)
        if info is None:
            raise ObjectUnavailable(f"node {short(node_id)} is not alive")
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._connecting[node_id] = fut
        try:
            conn = await connect((info.address.host, info.address.port), token=self.raylet.token,
                                 config=self.raylet.config, name=f"raylet->raylet {short(node_id)}")
            self._peers[node_id] = conn
            fut.set_result(conn)
            return conn
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()
            raise
        finally:
            self._connecting.pop(node_id, None)

    def _pread(self, object_id: ObjectID, offset: int, length: int) -> bytes:
        fd = self._open_object(object_id)
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def stats(self) -> dict[str, int]:
        return {"bytes_pulled": self.bytes_pulled, "bytes_served": self.bytes_served, "pulls": self.pulls_done,
                "pulls_in_progress": len(self._pulls)}

    def node_gone(self, node_id: NodeID) -> None:
        """The GCS declared ``node_id`` dead: pulls from it fail now (a frozen holder would
        hold them until their socket timeout; the owner then rebuilds the object)."""
        conn = self._peers.pop(node_id, None)
        if conn is not None:
            conn.close()
        with self._streams_lock:
            streams = self._streams.pop(node_id, set())
        for sock in streams:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # (the thread's recv returns: it closes the socket)
            except OSError:
                pass

    def free_copies(self, object_ids: list[ObjectID]) -> None:
        """Tell every other alive raylet to drop its copies of these objects."""
        for node_id in list(self.raylet.alive_nodes):
            if node_id == self.raylet.node_id:
                continue
            self.raylet._spawn(self._send_free(node_id, object_ids), "raylet.free_copies")

    async def _send_free(self, node_id: NodeID, object_ids: list[ObjectID]) -> None:
        try:
            conn = await self._peer(node_id)
        except (OSError, ConnectionLost, TimeoutError, ObjectUnavailable) as e:
            logger.debug("cannot reach node %s to free copies: %s", short(node_id), e)
            return
        conn.notify(m.FreeObjectCopies(object_ids))

    # ------------------------------------------------------------------ serving

    def object_size(self, object_id: ObjectID) -> list[int]:
        """``[size, data channel port]``; size -1 when the object is not sealed here."""
        obj = self.raylet.store.objects.get(object_id)
        if obj is None or not obj.sealed:
            return [-1, self.data_port]
        return [int(obj.size_bytes), self.data_port]

    async def read_chunk(self, object_id: ObjectID, offset: int, length: int) -> bytes | None:
        obj = self.raylet.store.objects.get(object_id)
        if obj is None or not obj.sealed or offset < 0 or length < 0 or offset + length > obj.size_bytes \
                or length > CHUNK_BYTES * 4:
            return None
        data = await asyncio.get_running_loop().run_in_executor(self._io, self._pread, object_id, offset, length)
        self.bytes_served += len(data)
        return data


class _Handshake:
    """One data-channel peer that has not authenticated yet (accept thread only)."""

    __slots__ = ("sock", "host", "deadline", "buf", "client_nonce", "server_nonce")

    def __init__(self, sock: socket.socket, host: str, deadline: float) -> None:
        self.sock = sock
        self.host = host
        #: ``time.monotonic()`` by which the whole handshake must be done.
        self.deadline = deadline
        self.buf = bytearray()
        self.client_nonce = b""
        #: Set once the server's hello went out.
        self.server_nonce: bytes | None = None


def client_handshake(sock: socket.socket, token: bytes, timeout_s: float) -> None:
    """The puller's side of the data-channel handshake, all of it within ``timeout_s``.

    The holder proves the token before the puller sends its own proof or any request.

    Raises:
        ConnectionError: the holder did not prove the token, refused ours, or went away.
        TimeoutError: the handshake took longer than ``timeout_s``.
    """
    auth.client_handshake_blocking(
        sock, token, timeout_s, _recv_exact,
        unproven="the data channel did not prove it holds the cluster token "
                 "(wrong token, or not a lumos raylet of this cluster)",
        refused="the data channel refused the handshake")


def _recv_exact(sock: socket.socket, n: int, deadline: float | None = None) -> bytes:
    """``n`` bytes; with ``deadline`` (monotonic), all of them by then, however they trickle in."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the data channel handshake timed out")
            sock.settimeout(left)
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the data channel")
        got += k
    return bytes(buf)


def _open_for_write(path: str, file_size: int, reused: bool) -> mmap.mmap:
    fd = open_object_file(path, create=not reused)
    try:
        if not reused:
            os.ftruncate(fd, file_size)
        return mmap.mmap(fd, file_size)
    finally:
        os.close(fd)


def _write(mm: mmap.mmap, offset: int, data: bytes) -> None:
    mm[offset:offset + len(data)] = data
