"""GCS storage on Redis servers, sharded by key hash (redis-py's asyncio client).

URL: ``redis://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...][/DB][?prefix=NAME]``
(``rediss://`` for TLS). Every server listed is one shard; the same list, in the same
order, must be given to every GCS that uses this storage (a restarted GCS checks the
count against the one recorded on the first shard).

Layout, with ``P`` the prefix (default ``lumos:``):

- a table row ``(table, key)`` is field ``key`` of the hash ``P{table}`` on shard
  ``crc32(table \\0 key) % shards``: every table is spread over every server;
- a stream is the Redis stream ``Pstream:{name}`` on shard ``crc32("stream" \\0 name) % shards``,
  trimmed with ``XADD ... MAXLEN ~ N``;
- ``Pmeta`` holds the shard count, on every shard: a shard without it has lost its data
  (a Redis restarted empty), and the GCS writes its live tables back (``lost_parts``).

A batch is one pipeline (no MULTI) per shard, the shards written concurrently; a batch
returns once every server has answered, so a write the GCS acknowledged is in Redis
(on disk as the server's ``appendfsync`` setting says: the operator's choice).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import urllib.parse
import zlib
from typing import Any, Awaitable, TypeVar

from lumos._private.gcs.storage import (Append, Delete, GcsStorage, Op, Put, StorageUnavailable,
                                        redact_url)

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
#: Stream entries read per XRANGE call at recovery.
_STREAM_PAGE = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class RedisUrl:
    hosts: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int
    ssl: bool
    prefix: str


def parse_redis_url(url: str) -> RedisUrl:
    """Parse a (possibly multi-host) Redis URL; ValueError says what is wrong with it."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("redis", "rediss"):
        raise ValueError(f"{redact_url(url)!r} is not a redis:// URL")
    rest, _, query = rest.partition("?")
    userinfo, at, hostpart = rest.rpartition("@")
    username = password = None
    if at:
        user, colon, pw = userinfo.partition(":")
        username = urllib.parse.unquote(user) or None
        password = urllib.parse.unquote(pw) if colon else None
        if not colon:  # redis://PASSWORD@host, as redis-cli takes it
            username, password = None, urllib.parse.unquote(user)
    hostpart, slash, dbpart = hostpart.partition("/")
    db = 0
    if slash and dbpart:
        if not dbpart.isdigit():
            raise ValueError(f"Redis database in {redact_url(url)!r} must be a number, got {dbpart!r}")
        db = int(dbpart)
    hosts = []
    for item in hostpart.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon:
            host, port = item.strip(), "6379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"bad Redis server {item!r} in {redact_url(url)!r}; expected HOST:PORT")
        hosts.append((host, int(port)))
    params = urllib.parse.parse_qs(query)
    unknown = set(params) - {"prefix"}
    if unknown:
        raise ValueError(f"unknown parameter(s) {sorted(unknown)} in {redact_url(url)!r}; valid: prefix")
    prefix = params.get("prefix", ["lumos"])[0]
    return RedisUrl(tuple(hosts), username, password, db, scheme == "rediss", prefix + ":")


def shard_of(name: bytes, shards: int) -> int:
    """The shard that holds ``name`` (stable across processes and versions: crc32)."""
    return zlib.crc32(name) % shards


class RedisStorage(GcsStorage):
    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import ExponentialBackoff
        self.url = parse_redis_url(url)
        self.description = redact_url(url)
        self.timeout_s = timeout_s
        self._prefix = self.url.prefix.encode()
        #: One client (its own connection pool) per server, in the URL's order. A command
        #: is tried again at most three times, within ~0.1 s: redis-py counts a refused
        #: password as a connection error, and its own default (ten tries, up to a second
        #: apart, since 8.0) let a wrong password run into ``timeout_s`` and be reported as
        #: a timeout instead of as the credentials' fault.
        self.shards = [aioredis.Redis(host=h, port=p, username=self.url.username, password=self.url.password,
                                      db=self.url.db, ssl=self.url.ssl, socket_timeout=timeout_s,
                                      socket_connect_timeout=timeout_s,
                                      retry=Retry(ExponentialBackoff(cap=0.05, base=0.01), 3))
                       for h, p in self.url.hosts]

    # ------------------------------------------------------------------ keys

    def table_key(self, table: str) -> bytes:
        return self._prefix + table.encode()

    def stream_key(self, stream: str) -> bytes:
        return self._prefix + b"stream:" + stream.encode()

    def shard_for_row(self, table: str, key: bytes) -> int:
        return shard_of(table.encode() + b"\0" + key, len(self.shards))

    def shard_for_stream(self, stream: str) -> int:
        return shard_of(b"stream\0" + stream.encode(), len(self.shards))

    # ------------------------------------------------------------------ calls

    async def _call(self, what: str, index: int, aw: Awaitable[_T]) -> _T:
        import redis.exceptions as rexc
        host, port = self.url.hosts[index]
        try:
            async with asyncio.timeout(self.timeout_s):
                return await aw
        except (rexc.AuthenticationError, rexc.AuthorizationError) as e:
            raise StorageUnavailable(f"Redis at {host}:{port} refused our credentials ({e}); "
                                     "check the user and password in the storage URL") from None
        except (rexc.ConnectionError, rexc.TimeoutError, OSError, TimeoutError) as e:
            raise StorageUnavailable(f"{what} on Redis at {host}:{port} failed: {type(e).__name__}: {e}") from None
        except rexc.ResponseError as e:
            if "NOAUTH" in str(e) or "WRONGPASS" in str(e) or "NOPERM" in str(e):
                raise StorageUnavailable(f"Redis at {host}:{port} refused us ({e}); check the user and "
                                         "password (and its ACL) in the storage URL") from None
            raise

    async def start(self) -> None:
        await asyncio.gather(*(self._call("PING", i, c.ping()) for i, c in enumerate(self.shards)))
        first = self.shards[0]
        recorded = await self._call("HGET", 0, first.hget(self._meta, b"shards"))
        if recorded is not None and int(recorded) != len(self.shards):
            raise StorageUnavailable(
                f"the GCS data under prefix {self.url.prefix!r} was written sharded over {int(recorded)} Redis "
                f"servers, and {self.description} lists {len(self.shards)}; give the same servers in the "
                "same order (or another ?prefix=)")
        await self.mark_parts()
        logger.info("GCS storage: Redis, %d shard(s): %s", len(self.shards), self.description)

    @property
    def _meta(self) -> bytes:
        return self._prefix + b"meta"

    async def lost_parts(self) -> list[str]:
        found = await asyncio.gather(*(self._call("HGET", i, c.hget(self._meta, b"shards"))
                                       for i, c in enumerate(self.shards)))
        return [f"Redis at {h}:{p}" for (h, p), v in zip(self.url.hosts, found) if v is None]

    async def mark_parts(self) -> None:
        count = str(len(self.shards)).encode()
        await asyncio.gather(*(self._call("HSET", i, c.hset(self._meta, b"shards", count))
                               for i, c in enumerate(self.shards)))

    async def write_batch(self, ops: list[Op]) -> None:
        pipes: dict[int, Any] = {}

        def pipe(index: int) -> Any:
            p = pipes.get(index)
            if p is None:
                p = pipes[index] = self.shards[index].pipeline(transaction=False)
            return p

        for op in ops:
            if isinstance(op, Put):
                pipe(self.shard_for_row(op.table, op.key)).hset(self.table_key(op.table), op.key, op.value)
            elif isinstance(op, Delete):
                pipe(self.shard_for_row(op.table, op.key)).hdel(self.table_key(op.table), op.key)
            elif isinstance(op, Append):
                pipe(self.shard_for_stream(op.stream)).xadd(self.stream_key(op.stream), {b"v": op.value},
                                                            maxlen=op.max_len, approximate=True)
            else:
                raise TypeError(f"not a storage op: {op!r}")
        await asyncio.gather(*(self._call(f"a write of {len(p)} commands", i, p.execute())
                               for i, p in pipes.items()))

    async def get(self, table: str, key: bytes) -> bytes | None:
        i = self.shard_for_row(table, key)
        value: bytes | None = await self._call("HGET", i, self.shards[i].hget(self.table_key(table), key))
        return value

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        parts = await asyncio.gather(*(self._call("HGETALL", i, c.hgetall(self.table_key(table)))
                                       for i, c in enumerate(self.shards)))
        out: dict[bytes, bytes] = {}
        for part in parts:
            out.update(part)
        return out

    async def read_stream(self, stream: str) -> list[bytes]:
        i = self.shard_for_stream(stream)
        client = self.shards[i]
        out: list[bytes] = []
        start = b"-"
        while True:
            page = await self._call("XRANGE", i, client.xrange(self.stream_key(stream), start, b"+",
                                                                count=_STREAM_PAGE))
            for entry_id, fields in page:
                out.append(fields[b"v"])
            if len(page) < _STREAM_PAGE:
                return out
            start = b"(" + page[-1][0]

    async def aclose(self) -> None:
        for c in self.shards:
            try:
                await c.aclose()
            except (OSError, RuntimeError) as e:  # a connection already broken: nothing to flush
                logger.debug("closing a Redis client: %s", e)
