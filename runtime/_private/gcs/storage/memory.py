"""In-memory GCS storage: the default, no setup, gone with the GCS process."""

from __future__ import annotations

from lumos._private.gcs.storage import GcsStorage


class InMemoryStorage(GcsStorage):
    def __init__(self) -> None:
        #: Table name -> key -> value.
        self._tables: dict[str, dict[bytes, bytes]] = {}

    async def put(self, table: str, key: bytes, value: bytes) -> None:
        self._tables.setdefault(table, {})[key] = value

    async def get(self, table: str, key: bytes) -> bytes | None:
        return self._tables.get(table, {}).get(key)

    async def delete(self, table: str, key: bytes) -> None:
        self._tables.get(table, {}).pop(key, None)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return dict(self._tables.get(table, {}))
