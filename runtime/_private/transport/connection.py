"""Authenticated, framed, bidirectional RPC connections over asyncio.

One ``Connection`` per socket, either end. It authenticates first, both ways (see
``protocol.auth``: the client checks the server's proof before it reads any other
frame), then carries msgpack frames both ways: requests with ids and
replies, one-way notifications, and server pushes. Writes made while one read's frames
(or one batch of jobs from other threads, see ``batch``) are handled leave in one
``write`` per connection at the end of that batch, in the same loop turn; other writes
leave together on the loop's next turn.

A peer fault (bad frame, wrong token, unknown message, oversized length) is a
``ProtocolError``: one log line, that connection closes, the process keeps serving.
The line is rate-limited per peer address (``PeerWarnings``), so a peer that retries
a bad handshake in a loop cannot fill the log.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import logging
import os
import select
import socket
import threading
import time
from typing import Any, Awaitable, Callable, Mapping

from lumos._private.config import Config
from lumos._private.protocol import auth
from lumos._private.protocol import messages as m
from lumos._private.protocol.framing import HEADER, FrameDecoder, ProtocolError

logger = logging.getLogger(__name__)

_pack_len = HEADER.pack
#: Frames waiting to be written that add up to at least this many bytes go out in one
#: gather write (``os.writev``) instead of being joined first, when there are at most
#: ``GATHER_MAX_PARTS`` pieces (the system's ``IOV_MAX`` is 1024).
GATHER_BYTES = 128 * 1024
GATHER_MAX_PARTS = 1024

Handler = Callable[["Connection", Any], Any]

# Server: _AWAIT_CLIENT_NONCE -> _AWAIT_CLIENT_PROOF -> _READY.
# Client: _AWAIT_SERVER_HELLO -> _AWAIT_OK -> _READY.
_AWAIT_CLIENT_NONCE, _AWAIT_CLIENT_PROOF, _AWAIT_SERVER_HELLO, _AWAIT_OK, _READY, _CLOSED = range(6)


class PeerWarnings:
    """One warning line per peer address per ``interval_s``; the lines in between are
    counted and their number joins the next line logged for that address.

    Thread-safe: the object manager's data channel warns from its threads.
    """

    #: Addresses remembered at most; older entries go first beyond it.
    MAX_ADDRESSES = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Peer address -> (time of its last logged line, lines suppressed since).
        self._last: dict[str, tuple[float, int]] = {}

    def warn(self, log: logging.Logger, address: str, interval_s: float, msg: str, *args: Any) -> bool:
        """Log ``msg % args`` unless ``address`` had a line within ``interval_s``. True if logged."""
        now = time.monotonic()
        with self._lock:
            last, suppressed = self._last.get(address, (-float("inf"), 0))
            if now - last < interval_s:
                self._last[address] = (last, suppressed + 1)
                return False
            self._last.pop(address, None)
            self._last[address] = (now, 0)
            if len(self._last) > self.MAX_ADDRESSES:
                del self._last[next(iter(self._last))]
        if suppressed:
            msg += " (%d more from this address since the last line)"
            args = (*args, suppressed)
        log.warning(msg, *args)
        return True


#: The process's one rate limiter for peer-fault warnings.
peer_warnings = PeerWarnings()


class _Batch(threading.local):
    """Per loop thread: while a batch of work runs (the frames of one read, the jobs
    posted from other threads), sends only mark their connection; the batch's end writes
    each once. Outside a batch a send schedules the write for the loop's next turn."""

    def __init__(self) -> None:
        self.depth = 0
        self.dirty: list["Connection"] = []


_batch = _Batch()


def _leave_batch(b: _Batch) -> None:
    """One level of batch ends; the outermost writes each connection its sends marked."""
    b.depth -= 1
    if b.depth == 0 and b.dirty:
        dirty, b.dirty = b.dirty, []
        for conn in dirty:
            conn._flush()


class batch:
    """``with batch():`` around a run of handlers on a loop thread."""

    __slots__ = ()

    def __enter__(self) -> None:
        _batch.depth += 1

    def __exit__(self, *exc: Any) -> None:
        _leave_batch(_batch)


class ConnectionLost(ConnectionError):
    """The peer went away (or never finished the handshake)."""


class WireVersionMismatch(ConnectionLost):
    """The peer runs a lumos whose frames this one cannot read (``auth.WIRE_VERSION``)."""


class RemoteError(Exception):
    """A request's handler raised on the peer; carries its type name and message."""

    def __init__(self, type_name: str, text: str) -> None:
        super().__init__(f"{type_name}: {text}")
        self.type_name = type_name
        self.text = text

    def __reduce__(self) -> Any:
        return (RemoteError, (self.type_name, self.text))


class Refusal(Exception):
    """A handler's answer that the request cannot be done now (a full store, an object
    that exists already): an outcome its caller handles, sent back as a ``RemoteError``
    like any other and logged only at debug level, where an unexpected exception is
    logged with its traceback."""


class Connection(asyncio.Protocol):
    """One authenticated connection. Create through ``connect`` or ``RpcServer``."""

    def __init__(self, *, token: bytes, is_server: bool, config: Config,
                 handlers: Mapping[type, Handler] | None, name: str,
                 on_close: Callable[["Connection"], None] | None = None) -> None:
        self._token = token
        self._is_server = is_server
        self._config = config
        #: Message class -> handler for requests and notifications from the peer.
        self.handlers: Mapping[type, Handler] = handlers or {}
        self.name = name
        self._on_close = on_close
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(config.max_preauth_frame_bytes)
        self._state = _AWAIT_CLIENT_NONCE if is_server else _AWAIT_SERVER_HELLO
        self._client_nonce = b""
        self._server_nonce = b""
        #: Why this end dropped the connection (given to ``ready``'s waiter), if it did.
        self._drop_reason = ""
        self._drop_error: type[ConnectionLost] = ConnectionLost
        self._out: list[bytes] = []
        self._flush_scheduled = False
        #: Writes from other threads (``write_now``): a duplicate of the socket's fd, made
        #: on the loop by ``allow_write_now``; -1 until then and after the close.
        self._wfd = -1
        #: Held around every write to the socket once ``_wfd`` exists, so a write from
        #: another thread never interleaves with the loop's.
        self._wlock = threading.Lock()
        #: What a ``write_now`` could not write at once; the loop's next flush sends it first.
        self._direct_rest: bytes | None = None
        self._next_rid = 1
        #: Request id -> future of its reply.
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: Resolved when the handshake completes (or fails).
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.closed: asyncio.Future[None] = self._loop.create_future()
        self._handshake_timer: asyncio.TimerHandle | None = None
        self._can_write = asyncio.Event()
        self._can_write.set()
        self._tasks: set[asyncio.Task[Any]] = set()
        #: Free-form slot for the owner of this connection (e.g. the worker id it serves).
        self.peer_info: Any = None
        self.peer = "?"
        #: The peer's address for rate-limited warnings (its host for TCP).
        self._peer_key = name
        #: Reads shared with another thread (``share_reading``), else None.
        self.shared: SharedReader | None = None

    # ---------------------------------------------------------------- asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        self.peer = f"{self.name}<-{peer or 'unix'}" if self._is_server else self.name
        if isinstance(peer, tuple) and peer:
            self._peer_key = str(peer[0])
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self._handshake_timer = self._loop.call_later(
            self._config.handshake_timeout_s, self._handshake_timed_out)
        if not self._is_server:
            self._client_nonce = auth.new_nonce()
            self._write_raw(auth.client_hello(self._client_nonce))

    def data_received(self, data: bytes) -> None:
        b = _batch
        b.depth += 1
        try:
            self._frames_received(self._decoder.feed(data))
        except ProtocolError as e:
            self._drop(str(e))
        finally:
            _leave_batch(b)

    def _read_what_is_left(self) -> None:
        """The loop dropped the connection on an error (a write that found the peer gone:
        ``EPIPE``, ``ECONNRESET``) without reading what the peer sent before it went: its
        last words, such as the reply of a worker that exits after its task (``max_calls``),
        which then counted as lost and the task ran again. Read them through the duplicate
        fd (``allow_write_now``), which keeps the socket open, before the close is handled."""
        fd = self._wfd
        poll = select.poll()
        poll.register(fd, select.POLLIN)
        for _ in range(4096):  # (what one socket buffer holds, in reads of 64 KiB, and more)
            try:
                data = os.read(fd, 65536) if poll.poll(0) else b""
            except OSError:  # reset after the data, or gone
                return
            if not data:
                return
            self.data_received(data)
            if self._state != _READY:
                return

    def frames_received(self, frames: list[bytes]) -> None:
        """Loop thread: handle frames another thread read (``SharedReader``)."""
        b = _batch
        b.depth += 1
        try:
            self._frames_received(frames)
        except ProtocolError as e:
            self._drop(str(e))
        finally:
            _leave_batch(b)

    def _frames_received(self, frames: list[bytes]) -> None:
        for payload in frames:
            if self._state == _CLOSED:
                return
            if self._state == _READY:
                self._on_frame(payload)
            else:
                self._on_handshake_frame(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc is not None and self._state == _READY and self._wfd >= 0 and self.shared is None:
            self._read_what_is_left()
        was = self._state
        self._state = _CLOSED
        self._close_wfd()
        if self.shared is not None:
            self.shared.detach()
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
        why = f": {exc}" if exc else f": {self._drop_reason}" if self._drop_reason else ""
        if not why and not self.ready.done() and was == _AWAIT_SERVER_HELLO:
            why = (" during the handshake, before proving the cluster token (a lumos of another "
                   "version, or not a lumos process)")
        err = self._drop_error(f"connection {self.peer} closed{why}")
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # mark retrieved; the waiter gets it too
        pending, self._pending = self._pending, {}
        for fut in pending.values():
            if not fut.done():
                fut.set_exception(err)
        if not self.closed.done():
            self.closed.set_result(None)
        self._can_write.set()
        if self._on_close is not None:
            try:
                self._on_close(self)
            except Exception:
                logger.exception("close callback of %s failed", self.peer)

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # ---------------------------------------------------------------- handshake

    def _on_handshake_frame(self, payload: bytes) -> None:
        if self._state == _AWAIT_CLIENT_NONCE:
            try:
                nonce, version = auth.parse_client_hello(payload)
            except ValueError:
                raise ProtocolError("authentication failed: the client sent a malformed nonce") from None
            if version != auth.WIRE_VERSION:
                if version is not None:
                    self._write_raw(auth.version_refusal())
                raise ProtocolError(auth.version_mismatch("the client", version))
            self._client_nonce = nonce
            hello, self._server_nonce = auth.server_hello(self._token, nonce)
            self._write_raw(hello)
            self._state = _AWAIT_CLIENT_PROOF
        elif self._state == _AWAIT_CLIENT_PROOF:
            if not auth.check_client_proof(self._token, self._client_nonce, self._server_nonce, payload):
                raise ProtocolError("authentication failed (wrong cluster token?)")
            self._write_raw(auth.OK)
            self._become_ready()
        elif self._state == _AWAIT_SERVER_HELLO:
            theirs = auth.parse_version_refusal(payload)
            if theirs is not None:
                self._drop_error = WireVersionMismatch
                raise ProtocolError(auth.version_mismatch(f"the lumos process at {self.peer}", theirs))
            server_nonce = auth.check_server_hello(self._token, self._client_nonce, payload)
            if server_nonce is None:
                raise ProtocolError("the server did not prove it holds the cluster token "
                                    "(wrong token, or not a lumos process of this cluster)")
            self._write_raw(auth.client_proof(self._token, self._client_nonce, server_nonce))
            self._state = _AWAIT_OK
        elif self._state == _AWAIT_OK:
            if payload != auth.OK:
                raise ProtocolError("server refused the handshake")
            self._become_ready()

    def _become_ready(self) -> None:
        self._state = _READY
        self._decoder.max_frame_bytes = self._config.max_frame_bytes
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None
        if not self.ready.done():
            self.ready.set_result(None)

    def _handshake_timed_out(self) -> None:
        if self._state not in (_READY, _CLOSED):
            self._drop("handshake timed out")

    # ---------------------------------------------------------------- frames

    def _on_frame(self, payload: bytes) -> None:
        kind, rid, body = m.decode(payload)
        if kind == m.REPLY:
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(body)
            return
        if kind == m.ERROR:
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                if isinstance(body, list) and len(body) == 2:
                    fut.set_exception(RemoteError(str(body[0]), str(body[1])))
                else:
                    fut.set_exception(RemoteError("ProtocolError", "malformed error reply"))
            return
        if kind != m.REQUEST and kind != m.NOTIFY:
            raise ProtocolError(f"unknown frame kind {kind}")
        handler = self.handlers.get(type(body))
        if handler is None:
            raise ProtocolError(f"unexpected message {type(body).__name__}")
        try:
            result = handler(self, body)
        except Exception as e:
            self._handler_failed(kind, rid, body, e)
            return
        if result is not None and inspect.isawaitable(result):
            task = self._loop.create_task(self._finish(kind, rid, body, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == m.REQUEST:
            self.send(m.REPLY, rid, result)

    async def _finish(self, kind: int, rid: int, body: Any, awaitable: Awaitable[Any]) -> None:
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if kind == m.REQUEST and self._state == _READY:
                self.send(m.ERROR, rid, ["Cancelled", "the server is shutting down"])
            raise
        except Exception as e:
            self._handler_failed(kind, rid, body, e)
            return
        if kind == m.REQUEST and self._state == _READY:
            self.send(m.REPLY, rid, result)

    def _handler_failed(self, kind: int, rid: int, body: Any, e: Exception) -> None:
        if isinstance(e, Refusal):
            logger.debug("%s: %s refused: %s: %s", self.peer, type(body).__name__, type(e).__name__, e)
        elif isinstance(e, (ValueError, KeyError, LookupError, PermissionError, TimeoutError)):
            logger.info("%s: %s failed: %s: %s", self.peer, type(body).__name__, type(e).__name__, e)
        else:
            logger.exception("%s: handler for %s failed", self.peer, type(body).__name__)
        if kind == m.REQUEST and self._state == _READY:
            self.send(m.ERROR, rid, [type(e).__name__, str(e)])

    # ---------------------------------------------------------------- sending

    def _write_raw(self, payload: bytes) -> None:
        assert self._transport is not None
        self._transport.write(_pack_len(len(payload)) + payload)

    def send(self, kind: int, rid: int, body: Any) -> None:
        if self._state == _CLOSED:
            return
        data = m.encode(kind, rid, body)
        self._out.append(_pack_len(len(data)))
        self._out.append(data)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            b = _batch
            if b.depth:
                b.dirty.append(self)  # written once when the batch ends, in this loop turn
            else:
                self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._wfd >= 0:
            with self._wlock:
                self._flush_locked()
        else:
            self._flush_locked()

    def _flush_locked(self) -> None:
        """Write what was sent. Through the duplicated fd when there is one and the
        transport holds nothing: ``os.write`` lets the process's other threads run during
        the call, where uvloop's ``write`` keeps the GIL (the driver's io thread, preempted
        inside its write by the worker that write woke, held up the calling thread)."""
        self._flush_scheduled = False
        rest = self._direct_rest
        if rest is not None:
            self._direct_rest = None
            if self._transport is not None and self._state != _CLOSED:
                self._transport.write(rest)
        t = self._transport
        out = self._out
        if out and t is not None and self._state != _CLOSED:
            data: bytes | memoryview
            if self._wfd >= 0 and not t.get_write_buffer_size() and len(out) <= GATHER_MAX_PARTS \
                    and sum(map(len, out)) >= GATHER_BYTES:
                # Large frames (a burst of calls with 64 KiB arguments) go out in one
                # ``writev`` of the pieces: a join of them was a fresh buffer over malloc's
                # mmap threshold each time, its pages faulted in anew (the driver's io thread
                # took ~13-39 page faults per such call, ~3 us each on a virtual machine).
                pieces = out.copy()
                out.clear()
                try:
                    n = os.writev(self._wfd, pieces)
                except OSError:  # full, or closing: the transport writes it, or finds out
                    n = 0
                for i, piece in enumerate(pieces):
                    size = len(piece)
                    if n < size:
                        if n:
                            pieces[i] = memoryview(piece)[n:]
                        t.writelines(pieces[i:])
                        return
                    n -= size
                return
            data = b"".join(out)
            out.clear()
            if self._wfd >= 0 and not t.get_write_buffer_size():
                try:
                    n = os.write(self._wfd, data)
                except OSError:  # full, or closing: the transport writes it, or finds out
                    n = 0
                if n == len(data):
                    return
                if n:
                    data = memoryview(data)[n:]  # (the rest, not copied)
            t.write(data)

    @property
    def direct_writes(self) -> bool:
        """``write_now`` may be used (``allow_write_now`` was called and it is open)."""
        return self._wfd >= 0

    def allow_write_now(self) -> None:
        """Loop thread: let ``write_now`` write to this connection from other threads."""
        if self._wfd >= 0 or self._state != _READY or self._transport is None:
            return
        sock = self._transport.get_extra_info("socket")
        if sock is not None:
            with self._wlock:
                self._wfd = os.dup(sock.fileno())

    def write_now(self, body: Any, went: list[Any] | None = None) -> bool:
        """Any thread: send a one-way message straight to the socket, saving the loop a
        wake-up, when nothing of this connection waits to be written before it (nothing
        queued, the transport's buffer empty). False: nothing was sent; use ``notify``
        on the loop. A frame the socket takes only part of is finished by the loop.
        ``went[0]`` is set True the moment the message is written, also when an exception
        (the stop button's ``KeyboardInterrupt``) leaves this call right after the write."""
        if self._wfd < 0 or self._state != _READY or not self._can_write.is_set():
            return False
        data = m.encode(m.NOTIFY, 0, body)
        return self._write_frames_now(_pack_len(len(data)) + data, went)

    def write_all_now(self, bodies: list[Any]) -> bool:
        """``write_now`` of several one-way messages, in order, in one write: all of
        them went (True), or none did."""
        if self._wfd < 0 or self._state != _READY or not self._can_write.is_set():
            return False
        frames = []
        for body in bodies:
            data = m.encode(m.NOTIFY, 0, body)
            frames.append(_pack_len(len(data)))
            frames.append(data)
        return self._write_frames_now(b"".join(frames))

    def _write_frames_now(self, frame: bytes, went: list[Any] | None = None) -> bool:
        with self._wlock:
            t = self._transport
            if self._wfd < 0 or self._state != _READY or self._out or self._flush_scheduled \
                    or self._direct_rest is not None or t is None or t.get_write_buffer_size():
                return False
            size = len(frame)
            written: list[int] = []
            try:
                # The count lands in ``written`` inside C: a KeyboardInterrupt (the stop
                # button, in the main thread) is raised only once the call returns, so
                # ``finally`` knows whether, and how much of, the frame went out. With
                # ``n = os.write(...)`` it could be raised between the write and the
                # assignment, and the rest of a partial write would never be sent.
                written.extend(map(os.write, (self._wfd,), (frame,)))
            except OSError:  # full (BlockingIOError) or closing: the loop's path handles it
                return False
            finally:
                if written:  # (nothing below calls into Python before the state is set)
                    if went is not None:
                        went[0] = True
                    n = written[0]
                    if n < size:
                        self._direct_rest = frame[n:]
                        self._flush_scheduled = True
                        self._loop.call_soon_threadsafe(self._flush)
        return True

    def _close_wfd(self) -> None:
        if self._wfd >= 0:
            with self._wlock:
                fd, self._wfd = self._wfd, -1
                self._direct_rest = None
            os.close(fd)

    def share_reading(self, wake: Callable[[], None], read_bytes: int = 0) -> "SharedReader | None":
        """Loop thread: let another thread read this connection's frames while it waits
        for them (``SharedReader``, reading up to ``read_bytes`` at a time: 0 for its
        default); ``wake()`` (loop thread) asks that thread to give the reading back.
        None where it cannot (closed, no socket)."""
        if self.shared is not None:
            return None if self.shared.detached else self.shared
        if self._state != _READY or self._transport is None or self._transport.is_closing():
            return None
        sock = self._transport.get_extra_info("socket")
        if sock is None:
            return None
        self.shared = SharedReader(self, sock.fileno(), wake, read_bytes or SharedReader.READ_BYTES)
        return self.shared

    def notify(self, body: Any) -> None:
        """Send a one-way message."""
        self.send(m.NOTIFY, 0, body)

    def request(self, body: Any) -> asyncio.Future[Any]:
        """Send a request; the returned future resolves with the reply."""
        fut: asyncio.Future[Any] = self._loop.create_future()
        if self._state == _CLOSED:
            fut.set_exception(ConnectionLost(f"connection {self.peer} is closed"))
            return fut
        rid = self._next_rid
        self._next_rid = rid + 1
        self._pending[rid] = fut
        self.send(m.REQUEST, rid, body)
        return fut

    async def call(self, body: Any, timeout_s: float | None = None) -> Any:
        """Send a request and wait for its reply, at most ``timeout_s`` seconds."""
        fut = self.request(body)
        try:
            if timeout_s is None:
                return await fut
            async with asyncio.timeout(timeout_s):
                return await fut
        finally:
            # A raised error's traceback holds this frame and the future holds the error:
            # break the cycle, which would keep the callers' frames alive until a collection.
            del fut

    def reply(self, rid: int, result: Any) -> None:
        self.send(m.REPLY, rid, result)

    async def drain(self) -> None:
        await self._can_write.wait()

    # ---------------------------------------------------------------- closing

    @property
    def is_closed(self) -> bool:
        return self._state == _CLOSED

    def _drop(self, reason: str) -> None:
        self._drop_reason = reason
        peer_warnings.warn(logger, self._peer_key, self._config.peer_warning_interval_s,
                           "dropping connection %s: %s", self.peer, reason)
        self.close()

    def close(self) -> None:
        if self._state == _CLOSED:
            return
        self._flush()
        self._state = _CLOSED
        self._close_wfd()
        if self.shared is not None:
            self.shared.detach()
        if self._transport is not None:
            self._transport.close()
        for task in list(self._tasks):
            task.cancel()


class SharedReader:
    """A connection whose frames one other thread may read itself while it waits for
    them: a worker's main thread, idle between tasks, reads the next ``PushTask`` from
    its owner's socket instead of being woken by the loop's thread once that read it
    (on 2 cores a wake-up across threads costs ~30 us of latency and the loop's own
    wake-up and read besides).

    ```
     loop thread (owns the reading)          other thread (``take`` .. ``release``)
     epoll E (its fd on the loop) ─► read     poll(fd) ─► read ─► frames
       ─► Connection.frames_received            one it runs itself; others: ``hand_to_loop``
    ```

    The transport's own reading is paused for the whole time; the loop reads through a
    private epoll set ``E`` holding a duplicate of the socket's fd, and the other thread
    takes and gives back the reading by removing the fd from ``E`` and adding it again
    (``epoll_ctl`` is safe from any thread, and the loop's registration of ``E`` never
    changes), so neither hand-over costs the loop a wake-up. One reader at a time: the
    frame decoder's state passes with the reading. Frames the other thread hands back are
    handled by the loop before it reads anything more (their order is kept).

    ``detach`` (the connection closed, or the reading is no longer wanted) gives the
    reading back to the transport once the loop holds it; the transport then reads on
    (and sees the peer's close, if that is what ended it).
    """

    #: Bytes read at most per read (a larger buffer is an mmap, mremap and munmap per read
    #: where malloc's mmap threshold is glibc's adaptive one, 128 KiB at first).
    READ_BYTES = 65536

    def __init__(self, conn: Connection, sock_fd: int, wake: Callable[[], None],
                 read_bytes: int = READ_BYTES) -> None:
        self.conn = conn
        self.read_bytes = read_bytes
        self._loop = conn._loop
        self._wake = wake
        #: The socket, duplicated; reads from either thread go through it.
        self.fd = os.dup(sock_fd)
        self._ep = select.epoll(1)
        self._lock = threading.Lock()
        #: The loop holds the reading (the fd is in ``E``); else the other thread does.
        self._loop_owns = True
        #: The loop is inside a read (``take`` must wait for the next turn).
        self._loop_busy = False
        #: Frame batches handed to the loop and not handled yet.
        self._handed = 0
        #: No further ``take``; the transport gets the reading back.
        self.detached = False
        self._disposed = False
        self._ep.register(self.fd, select.EPOLLIN)
        self._loop.add_reader(self._ep.fileno(), self._loop_readable)
        assert conn._transport is not None
        conn._transport.pause_reading()

    # ---------------------------------------------------------------- loop thread

    def _loop_readable(self) -> None:
        with self._lock:
            if not self._loop_owns or self._handed or self._disposed:
                return  # handed frames go first; the level-triggered set reports it again
            self._loop_busy = True
        try:
            try:
                data = os.read(self.fd, self.read_bytes)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if not data:  # the peer closed (or the socket failed): the transport reads that itself
                self.detached = True
                return
            self.conn.data_received(data)
        finally:
            with self._lock:
                self._loop_busy = False
            if self.detached:
                self._revert()

    def _handle_handed(self, frames: list[bytes]) -> None:
        try:
            self.conn.frames_received(frames)
        finally:
            with self._lock:
                self._handed -= 1
            if self.detached:
                self._revert()

    def detach(self) -> None:
        """Loop thread: stop sharing; the transport reads again once the loop holds the
        reading (at once, or when the other thread gives it back)."""
        with self._lock:  # (after this the other thread cannot take it any more)
            self.detached = True
            loop_owns = self._loop_owns
        if loop_owns:
            self._revert()  # (later, when the loop is busy reading or has frames handed to it)
        else:
            self._wake()

    def _revert(self) -> None:
        if self._disposed or not self._loop_owns or self._loop_busy or self._handed:
            return
        self._disposed = True
        self._loop.remove_reader(self._ep.fileno())
        self._ep.close()
        os.close(self.fd)
        conn = self.conn
        if conn.shared is self:
            conn.shared = None
        t = conn._transport
        if t is not None and not t.is_closing() and conn._state != _CLOSED:
            t.resume_reading()

    # ---------------------------------------------------------------- other thread

    def take(self) -> bool:
        """Take the reading; False when the loop holds it busy (or it is detached)."""
        with self._lock:
            if self.detached or self._loop_busy or self._handed or not self._loop_owns or self._disposed:
                return False
            self._ep.modify(self.fd, 0)  # (a MOD, not DEL/ADD: adding to a watched set takes a global lock)
            self._loop_owns = False
        return True

    def release(self) -> None:
        """Give the reading back to the loop (what arrived meanwhile wakes it)."""
        with self._lock:
            if self._loop_owns:
                return
            self._loop_owns = True
            if not self.detached:
                self._ep.modify(self.fd, select.EPOLLIN)
                return
        try:
            self._loop.call_soon_threadsafe(self._revert)
        except RuntimeError:  # the loop is closed: the process is ending
            pass

    def read_frames(self) -> list[bytes] | None:
        """While holding the reading: the complete frames one read brings ([] for none
        yet); None when the connection ended or failed (give the reading back: the loop
        finds out the same and closes it)."""
        try:
            data = os.read(self.fd, self.read_bytes)
        except (BlockingIOError, InterruptedError):
            return []
        except OSError:
            return None
        if not data:
            return None
        try:
            return self.conn._decoder.feed(data)
        except ProtocolError as e:
            self._loop.call_soon_threadsafe(self.conn._drop, str(e))
            return None

    def hand_to_loop(self, frames: list[bytes]) -> None:
        """Have the loop handle ``frames`` (in order, before anything it reads later)."""
        with self._lock:
            self._handed += 1
        try:
            self._loop.call_soon_threadsafe(self._handle_handed, frames)
        except RuntimeError:
            with self._lock:
                self._handed -= 1


async def connect(address: m.Address | tuple[str, int] | str, *, token: bytes, config: Config,
                  handlers: Mapping[type, Handler] | None = None, name: str = "peer",
                  on_close: Callable[[Connection], None] | None = None,
                  use_unix: bool = True, timeout_s: float | None = None) -> Connection:
    """Open and authenticate a connection.

    ``address`` is an ``Address`` (its Unix socket when ``use_unix`` and it has one,
    else TCP), a ``(host, port)`` pair, or a Unix socket path.
    """
    loop = asyncio.get_running_loop()

    def factory() -> Connection:
        return Connection(token=token, is_server=False, config=config, handlers=handlers,
                          name=name, on_close=on_close)

    deadline = config.connect_timeout_s if timeout_s is None else timeout_s
    async with asyncio.timeout(deadline):
        if isinstance(address, m.Address):
            if use_unix and address.unix_path:
                _, conn = await loop.create_unix_connection(factory, address.unix_path)
            else:
                _, conn = await loop.create_connection(factory, address.host, address.port)
        elif isinstance(address, str):
            _, conn = await loop.create_unix_connection(factory, address)
        else:
            _, conn = await loop.create_connection(factory, address[0], address[1])
        try:
            await conn.ready
        except BaseException:
            # Cancelled (its caller shutting down) or out of time in the handshake: the
            # socket is closed here, or it outlived the loop (uvloop's "unclosed resource").
            # Its owner never had it, so it hears nothing of the close.
            conn._on_close = None
            conn.close()
            raise
    return conn


class ConnectionCache:
    """One open connection per key (a worker or node id), opened once even when many
    coroutines ask for it at the same time."""

    def __init__(self) -> None:
        self.conns: dict[Any, Connection] = {}
        self._opening: dict[Any, asyncio.Future[Connection]] = {}

    async def get(self, key: Any, open_fn: Callable[[], Awaitable[Connection]]) -> Connection:
        conn = self.conns.get(key)
        if conn is not None and not conn.is_closed:
            return conn
        pending = self._opening.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Connection] = asyncio.get_running_loop().create_future()
        self._opening[key] = fut
        try:
            conn = await open_fn()
            self.conns[key] = conn
            fut.set_result(conn)
            return conn
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
            raise
        finally:
            self._opening.pop(key, None)

    def discard(self, key: Any, conn: Connection | None = None) -> None:
        """Forget ``key``'s connection (only if it is ``conn``, when given)."""
        if conn is None or self.conns.get(key) is conn:
            self.conns.pop(key, None)

    def close_all(self) -> None:
        for conn in list(self.conns.values()):
            conn.close()
        self.conns.clear()


def _listening_socket(host: str, port: int) -> socket.socket | None:
    """A listening TCP socket on a numeric address, or None for a host name. The loop's
    own ``create_server(host, ...)`` resolves even a numeric address through
    ``getaddrinfo`` on uvloop's thread pool: four threads started in every worker (and
    the CPU they cost at each actor creation) for nothing."""
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(100)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


class RpcServer:
    """Accepts authenticated connections on a Unix socket and/or a TCP port."""

    def __init__(self, *, token: bytes, config: Config, handlers: Mapping[type, Handler],
                 name: str, on_close: Callable[[Connection], None] | None = None) -> None:
        self._token = token
        self._config = config
        self.handlers = dict(handlers)
        self.name = name
        self._on_close = on_close
        self._servers: list[asyncio.base_events.Server] = []
        #: Live connections accepted by this server.
        self.connections: set[Connection] = set()
        self.unix_path = ""
        self.host = ""
        self.port = 0

    def _factory(self) -> Connection:
        conn = Connection(token=self._token, is_server=True, config=self._config,
                          handlers=self.handlers, name=self.name, on_close=self._closed)
        self.connections.add(conn)
        return conn

    def _closed(self, conn: Connection) -> None:
        self.connections.discard(conn)
        if self._on_close is not None:
            self._on_close(conn)

    async def start(self, *, unix_path: str | None = None, host: str | None = None,
                    port: int = 0) -> None:
        loop = asyncio.get_running_loop()
        if unix_path:
            if os.path.exists(unix_path):
                os.unlink(unix_path)
            srv = await loop.create_unix_server(self._factory, unix_path)
            os.chmod(unix_path, 0o600)
            self._servers.append(srv)
            self.unix_path = unix_path
        if host is not None:
            sock = _listening_socket(host, port)
            if sock is not None:
                srv = await loop.create_server(self._factory, sock=sock)
            else:
                srv = await loop.create_server(self._factory, host, port, reuse_address=True)
            self._servers.append(srv)
            sockname = srv.sockets[0].getsockname()
            self.host, self.port = sockname[0], sockname[1]

    async def stop(self) -> None:
        for srv in self._servers:
            srv.close()
        for conn in list(self.connections):
            conn.close()
        for srv in self._servers:
            try:
                async with asyncio.timeout(1.0):
                    await srv.wait_closed()
            except TimeoutError:
                pass
        self._servers.clear()
        if self.unix_path:
            try:
                os.unlink(self.unix_path)
            except FileNotFoundError:
                pass


def parse_address(text: str) -> tuple[str, int] | str:
    """``unix:/path`` -> the path; ``host:port`` -> ``(host, port)``."""
    if text.startswith("unix:"):
        return text[5:]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"address {text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


async def connect_with_retry(address: m.Address | tuple[str, int] | str, *, token: bytes, config: Config,
                             handlers: Mapping[type, Handler] | None = None, name: str = "peer",
                             on_close: Callable[[Connection], None] | None = None,
                             timeout_s: float | None = None) -> Connection:
    """``connect``, retrying refused or missing sockets (a peer still starting) until the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (config.connect_timeout_s if timeout_s is None else timeout_s)
    delay = 0.01
    while True:
        try:
            return await connect(address, token=token, config=config, handlers=handlers, name=name,
                                 on_close=on_close, timeout_s=max(0.1, deadline - loop.time()))
        except (FileNotFoundError, ConnectionRefusedError) as e:
            if loop.time() + delay > deadline:
                raise ConnectionLost(f"could not reach {name} at {address}: {e}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)
