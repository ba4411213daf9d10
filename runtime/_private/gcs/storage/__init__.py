"""Where the GCS keeps its tables: an interface, with an in-memory backend.

Keys and values are bytes; tables are names. The GCS keeps a hot copy of its tables in
memory and writes the node and KV tables through, so a backend only needs to be
durable, not fast. A Redis backend (for a GCS that restarts and recovers its tables,
with clients that reconnect) is planned and not built: asking for it is an error.
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


def check_storage_url(url: str) -> None:
    """Raise ValueError unless ``url`` names a storage this version has."""
    if url in ("", "memory"):
        return
    if url.startswith("redis://"):
        raise ValueError("Redis-backed GCS storage (a GCS that restarts and recovers its tables) is "
                         "not available in this version of lumos; the GCS keeps its tables in memory")
    raise ValueError(f"unknown GCS storage {url!r}; use 'memory'")


def create_storage(url: str) -> GcsStorage:
    """The storage named by ``url``: ``memory`` (the default) is the one there is."""
    check_storage_url(url)
    from lumos._private.gcs.storage.memory import InMemoryStorage
    return InMemoryStorage()
