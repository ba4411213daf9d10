"""In-memory GCS storage: the default, no setup, gone with the GCS process."""

from __future__ import annotations

from collections import deque

from lumos._private.gcs.storage import Append, Delete, GcsStorage, Op, Put


class InMemoryStorage(GcsStorage):
    description = "memory"
    durable = False

    def __init__(self) -> None:
        #: Table name -> key -> value.
        self._tables: dict[str, dict[bytes, bytes]] = {}
        #: Stream name -> its last entries.
        self._streams: dict[str, deque[bytes]] = {}

    async def write_batch(self, ops: list[Op]) -> None:
        for op in ops:
            if isinstance(op, Put):
                self._tables.setdefault(op.table, {})[op.key] = op.value
            elif isinstance(op, Delete):
                self._tables.get(op.table, {}).pop(op.key, None)
            elif isinstance(op, Append):
                stream = self._streams.setdefault(op.stream, deque())
                stream.append(op.value)
                while len(stream) > max(1, op.max_len):
                    stream.popleft()
            else:
                raise TypeError(f"not a storage op: {op!r}")

    async def get(self, table: str, key: bytes) -> bytes | None:
        return self._tables.get(table, {}).get(key)

    async def get_all(self, table: str) -> dict[bytes, bytes]:
        return dict(self._tables.get(table, {}))

    async def read_stream(self, stream: str) -> list[bytes]:
        return list(self._streams.get(stream, ()))
