"""Where the GCS keeps its tables: an interface with in-memory and Redis backends.

Keys and values are bytes; tables are names. The GCS keeps a hot copy of every table
in memory and writes through, so a backend only needs to be durable, not fast.
"""

from __future__ import annotations

import abc


class GcsStorage(abc.ABC):
    """Key-value storage grouped in named tables."""

    @abc.abstractmethod
    async def put(self, table: str, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    async def get(self, table: str, key: bytes) -> bytes | None: ...

    @abc.abstractmethod
    async def delete(self, table: str, key: bytes) -> None: ...

    @abc.abstractmethod
    async def get_all(self, table: str) -> dict[bytes, bytes]: ...

    async def aclose(self) -> None:
        return None


def create_storage(url: str) -> GcsStorage:
    """``memory`` (default) or ``redis://host:port[,host:port...]``."""
    if url in ("", "memory"):
        from lumos._private.gcs.storage.memory import InMemoryStorage
        return InMemoryStorage()
    if url.startswith("redis://"):
        from lumos._private.gcs.storage.redis_storage import RedisStorage  # type: ignore[import-not-found]
        return RedisStorage(url)  # type: ignore[no-any-return]
    raise ValueError(f"unknown GCS storage {url!r}; use 'memory' or 'redis://host:port'")
