"""Where the GCS keeps its tables: one interface, an in-memory and a Redis backend.

Keys and values are bytes; tables are names. The GCS serves from a hot copy of its
tables in memory and writes every change through to its storage (``StorageWriter``
orders and batches the writes), so a backend only needs to be durable, not fast. At
start the GCS reads every table back (``get_all``) and replays the task-event stream:
with Redis that is how a restarted GCS recovers.

```
GcsServer ──put_nowait/delete_nowait/append_nowait──► StorageWriter ──write_batch──► GcsStorage
   │ (a reply waits for its writes: wait_written)            (one batch at a time, in order)
   └── at start: get_all(table), read_stream(name) ◄──────────────────────────────────┘
```

Backends: ``memory`` (the default, gone with the process) and
``redis://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][/DB][?prefix=NAME]`` (``RedisStorage``,
keys sharded by hash across the listed servers).

What lives here: this module (the ``GcsStorage`` interface, ``StorageWriter``,
``create_storage``), ``memory.py`` and ``redis_storage.py`` (speaks RESP itself). May
import: the standard library and ``protocol`` (only to pack table rows); knows tables,
keys and bytes, never what the GCS keeps in them.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
from typing import Any

logger = logging.getLogger(__name__)


class StorageUnavailable(OSError):
    """The storage did not take a read or write (a Redis server down or unreachable)."""


@dataclasses.dataclass(slots=True)
class Put:
    table: str
    key: bytes
    value: bytes


@dataclasses.dataclass(slots=True)
class Delete:
    table: str
    key: bytes


@dataclasses.dataclass(slots=True)
class Append:
    """Add ``value`` to the stream ``stream``, keeping about its last ``max_len`` entries."""

    stream: str
    value: bytes
    max_len: int


Op = Put | Delete | Append


class GcsStorage(abc.ABC):
    """Key-value storage grouped in named tables, plus bounded append-only streams."""

    #: Shown in logs and errors ("memory", "redis://host:port,...", no password).
    description = "memory"
    #: Outlives the GCS process: the GCS writes its tables through and reloads them at start.
    durable = True

    async def start(self) -> None:
        """Connect and check the backend; raises ``StorageUnavailable`` if it cannot be used."""
        return None

    @abc.abstractmethod
    async def write_batch(self, ops: list[Op]) -> None:
        """Apply ``ops``; ops on the same key or stream take effect in list order."""

    @abc.abstractmethod
    async def get(self, table: str, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    async def get_all(self, table: str) -> dict[bytes, bytes]: ...

    @abc.abstractmethod
    async def read_stream(self, stream: str) -> list[bytes]:
        """Every entry kept in ``stream``, oldest first."""

    async def lost_parts(self) -> list[str]:
        """The parts of the storage that answer but no longer hold what was written to them.

        A Redis server restarted without its data (no append-only file, or a new data
        dir) is one: the GCS then writes its live tables back and calls ``mark_parts``.
        Raises ``StorageUnavailable`` when a part does not answer (the GCS's health check).
        """
        return []

    async def mark_parts(self) -> None:
        """Record in every part that it holds this storage's data (see ``lost_parts``)."""
        return None

    async def put(self, table: str, key: bytes, value: bytes) -> None:
        await self.write_batch([Put(table, key, value)])

    async def delete(self, table: str, key: bytes) -> None:
        await self.write_batch([Delete(table, key)])

    async def append(self, stream: str, value: bytes, max_len: int) -> None:
        await self.write_batch([Append(stream, value, max_len)])

    async def aclose(self) -> None:
        return None


def check_storage_url(url: str) -> None:
    """Raise ValueError unless ``url`` names a storage this version has (with the reason)."""
    if url in ("", "memory"):
        return
    if url.startswith(("redis://", "rediss://")):
        from lumos._private.gcs.storage.redis_storage import parse_redis_url
        parse_redis_url(url)
        return
    raise ValueError(f"unknown GCS storage {redact_url(url)!r}; use 'memory' or "
                     "'redis://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]'")


def redact_url(url: str) -> str:
    """``url`` without its password (for logs, errors and command lines)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, hosts = rest.rpartition("@")
    if not at:
        return url
    user = userinfo.partition(":")[0]
    return f"{scheme}://{user}:***@{hosts}"


def create_storage(url: str, timeout_s: float = 5.0) -> GcsStorage:
    """The storage named by ``url`` (see the module docstring), not yet started."""
    check_storage_url(url)
    if url in ("", "memory"):
        from lumos._private.gcs.storage.memory import InMemoryStorage
        return InMemoryStorage()
    from lumos._private.gcs.storage.redis_storage import RedisStorage
    return RedisStorage(url, timeout_s=timeout_s)


class StorageWriter:
    """Writes the GCS's table changes to its storage in order, batched, off the caller's path.

    Callers enqueue without waiting (``put_nowait`` returns the write's sequence number)
    and, before acknowledging anything that depends on it, ``await wait_written(seq)``.
    One batch is in flight at a time; writes to the same key within a batch collapse to
    the last. A batch the storage refuses is retried, with backoff, until it is taken.
    Stream appends waiting meanwhile are bounded by ``max_pending_append_bytes``: past
    it the oldest are dropped (they are telemetry; a warning says so once per outage),
    so a long storage outage does not grow the GCS by every task's events.
    """

    def __init__(self, storage: GcsStorage, retry_max_s: float = 2.0,
                 max_pending_append_bytes: int = 64 * 1024 * 1024) -> None:
        self.storage = storage
        self._retry_max_s = retry_max_s
        self.max_pending_append_bytes = max_pending_append_bytes
        #: Bytes of the appends waiting in ``_appends``.
        self._append_bytes = 0
        #: Appends dropped because too many waited (in all, and whether this outage was logged).
        self.dropped_appends = 0
        self._dropping = False
        #: Table ops waiting for the next batch, by (table, key): the last one wins.
        self._ops: dict[tuple[str, bytes], Put | Delete] = {}
        #: Stream appends waiting for the next batch, in order.
        self._appends: list[Append] = []
        #: Sequence number of the last enqueued table write.
        self.enqueued = 0
        #: Every table write up to this sequence number is in the storage.
        self.written = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: The storage is refusing writes (logged once per episode).
        self.failing = False
        #: How many such episodes there were (the GCS writes its tables again after one).
        self.outages = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gcs.storage_writer")
        self._task.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        if not t.cancelled() and t.exception() is not None:
            logger.error("the GCS storage writer failed", exc_info=t.exception())

    def put_nowait(self, table: str, key: bytes, value: bytes) -> int:
        self._ops[(table, key)] = Put(table, key, value)
        return self._bump()

    def delete_nowait(self, table: str, key: bytes) -> int:
        self._ops[(table, key)] = Delete(table, key)
        return self._bump()

    def append_nowait(self, stream: str, value: bytes, max_len: int) -> None:
        """Stream appends are telemetry: nothing waits for them."""
        appends = self._appends
        appends.append(Append(stream, value, max_len))
        self._append_bytes += len(value)
        if self._append_bytes > self.max_pending_append_bytes and len(appends) > 1:
            drop = 0
            size = self._append_bytes
            while size > self.max_pending_append_bytes and drop < len(appends) - 1:
                size -= len(appends[drop].value)
                drop += 1
            del appends[:drop]
            self._append_bytes = size
            self.dropped_appends += drop
            if not self._dropping:
                self._dropping = True
                logger.warning("GCS storage %s is not taking writes fast enough: dropping the oldest waiting "
                               "stream entries (task events) beyond max_pending_append_bytes=%d; the tables "
                               "are kept", self.storage.description, self.max_pending_append_bytes)
        self._wake.set()

    def _bump(self) -> int:
        self.enqueued += 1
        self._wake.set()
        return self.enqueued

    async def wait_written(self, seq: int) -> None:
        if self.written >= seq:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        await fut

    async def flush(self) -> None:
        await self.wait_written(self.enqueued)

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._ops and not self._appends:
                continue
            batch: list[Op] = [*self._ops.values(), *self._appends]
            upto = self.enqueued
            self._ops = {}
            self._appends = []
            self._append_bytes = 0
            failed: Exception | None = None
            try:
                await self._write(batch)
            except Exception as e:  # not an outage (those are retried): a bug or a refused command
                logger.exception("GCS storage %s refused a batch of %d writes; they are lost",
                                 self.storage.description, len(batch))
                failed = StorageUnavailable(f"a write to GCS storage {self.storage.description} failed: "
                                            f"{type(e).__name__}: {e}")
            self.written = upto
            keep = []
            for seq, fut in self._waiters:
                if seq <= upto:
                    if not fut.done():
                        if failed is None:
                            fut.set_result(None)
                        else:
                            fut.set_exception(failed)
                else:
                    keep.append((seq, fut))
            self._waiters = keep

    async def _write(self, batch: list[Op]) -> None:
        delay = 0.05
        while True:
            try:
                await self.storage.write_batch(batch)
            except StorageUnavailable as e:
                if not self.failing:
                    logger.warning("GCS storage %s refused a write (%s); retrying until it is back",
                                   self.storage.description, e)
                    self.failing = True
                    self.outages += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._retry_max_s)
                continue
            if self.failing:
                logger.warning("GCS storage %s takes writes again", self.storage.description)
                self.failing = False
            self._dropping = False
            return

    async def aclose(self, timeout_s: float = 5.0) -> None:
        """Write what is queued (within ``timeout_s``), then stop."""
        if self._task is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await self.flush()
        except TimeoutError:
            logger.error("GCS storage %s: %d queued table writes were not written before shutdown",
                         self.storage.description, self.enqueued - self.written)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass
        self._task = None
        for _, fut in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters = []


class StorageHealthState:
    """Pure: whether the GCS's storage answers, since when it has not, and when the GCS must exit.

    The GCS checks its storage every ``gcs_storage_check_interval_ms`` and tells this
    what it saw (``failed``/``answered``, time passed in). Unreachable for longer than
    ``exit_after_s`` (``gcs_storage_unavailable_exit_s``), the GCS exits: it cannot
    acknowledge anything durable, and a GCS restarted once the storage is back recovers.
    """

    def __init__(self, exit_after_s: float) -> None:
        self.exit_after_s = exit_after_s
        #: Monotonic time of the first failed check of the current outage (None: healthy).
        self.unavailable_since: float | None = None
        #: What the last failed check said.
        self.reason = ""

    @property
    def healthy(self) -> bool:
        return self.unavailable_since is None

    def failed(self, reason: str, now: float) -> bool:
        """A check failed; True when the outage has lasted past ``exit_after_s`` (exit now)."""
        if self.unavailable_since is None:
            self.unavailable_since = now
        self.reason = reason
        return now - self.unavailable_since >= self.exit_after_s

    def answered(self, now: float) -> float | None:
        """A check succeeded; how long the outage it ends lasted (None: there was none)."""
        if self.unavailable_since is None:
            return None
        lasted = now - self.unavailable_since
        self.unavailable_since = None
        self.reason = ""
        return lasted

    def describe(self, now: float) -> str:
        """One line for logs and ``lumos status``."""
        if self.unavailable_since is None:
            return "ok"
        down = now - self.unavailable_since
        return (f"unavailable for {down:.1f}s ({self.reason}); the GCS exits after "
                f"gcs_storage_unavailable_exit_s={self.exit_after_s:g}s")


def pack_value(obj: Any) -> bytes:
    """Encode a table row (messages nest) with the wire codec."""
    from lumos._private.protocol import messages as m
    return m.encode(m.NOTIFY, 0, obj)


def unpack_value(data: bytes) -> Any:
    from lumos._private.protocol import messages as m
    return m.decode(data)[2]
