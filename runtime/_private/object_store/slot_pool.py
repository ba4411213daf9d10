"""The free slots of one node's object store, kept for reuse (part of ``ObjectStoreState``).

A slot is a store file whose object was freed; its *mapper* is the process that last
wrote it and may still hold its mapping (its pages already faulted in), so a create by
that process prefers it. Slots are kept oldest first (evicted in that order) and also
indexed by mapper, so finding a process's own slot does not scan the others' (with
1,000 slots of another process pooled ahead of it, a create, seal and free took the
raylet 150-280 µs when it scanned them, 14-37 µs with the index). Each slot also has
the time it was pooled: the oldest is the one idle longest (``idle_since``), which the
store trims after a while (``object_store_pool_idle_s``).
Pure data structure; no files.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Iterator


class SlotPool:
    """Free slots: slot -> (file size, last mapper), oldest first, indexed by mapper."""

    def __init__(self) -> None:
        self._slots: OrderedDict[int, tuple[int, bytes]] = OrderedDict()
        #: Mapper -> its slots (slot -> file size), oldest first.
        self._by_mapper: dict[bytes, OrderedDict[int, int]] = {}
        #: Bytes of all pooled files.
        self.bytes = 0
        #: Slot -> when it was pooled (the caller's clock), in the order of ``_slots``.
        self._since: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, slot: int) -> bool:
        return slot in self._slots

    def items(self) -> Iterator[tuple[int, tuple[int, bytes]]]:
        return iter(self._slots.items())

    def add(self, slot: int, file_size: int, mapper: bytes, now: float) -> None:
        self._slots[slot] = (file_size, mapper)
        self._since[slot] = now
        self._by_mapper.setdefault(mapper, OrderedDict())[slot] = file_size
        self.bytes += file_size

    def peek(self, slot: int) -> tuple[int, bytes]:
        """``slot``'s ``(file size, mapper)``, left in the pool."""
        return self._slots[slot]

    def take(self, slot: int) -> tuple[int, bytes]:
        """Remove ``slot``; returns its ``(file size, mapper)``."""
        file_size, mapper = self._slots.pop(slot)
        del self._since[slot]
        self._unindex(slot, mapper)
        self.bytes -= file_size
        return file_size, mapper

    def idle_since(self) -> float | None:
        """When the slot pooled longest ago was pooled (None: the pool is empty)."""
        return next(iter(self._since.values()), None)

    def take_oldest(self) -> tuple[int, int, bytes]:
        """Remove the oldest slot; returns ``(slot, file size, mapper)``."""
        slot, (file_size, mapper) = self._slots.popitem(last=False)
        del self._since[slot]
        self._unindex(slot, mapper)
        self.bytes -= file_size
        return slot, file_size, mapper

    def pick(self, size: int, client: bytes) -> int | None:
        """A slot that fits ``size`` bytes without wasting more than half: ``client``'s
        own newest first (its pages are likeliest still in the caches, and the readers of
        its last values still hold spare mappings of it: a process cycling through few
        slots keeps reusing them), else the oldest of any mapper's."""
        own = self._by_mapper.get(client)
        if own:
            for slot, file_size in reversed(own.items()):
                if _fits(size, file_size):
                    return slot
        for slot, (file_size, mapper) in self._slots.items():
            if mapper != client and _fits(size, file_size):
                return slot
        return None

    def forget_mapper(self, mapper: bytes) -> None:
        """``mapper`` is gone: its slots stay, mapped by nobody (``b""``)."""
        if not mapper or mapper not in self._by_mapper:
            return
        slots = self._by_mapper.pop(mapper)
        nobody = self._by_mapper.setdefault(b"", OrderedDict())
        for slot, file_size in slots.items():
            self._slots[slot] = (file_size, b"")
            nobody[slot] = file_size

    def check(self) -> None:
        """Raise ``AssertionError`` when the index or the byte count drifted."""
        if sum(s for s, _ in self._slots.values()) != self.bytes:
            raise AssertionError("pool accounting drifted")
        indexed = {(slot, size, mapper) for mapper, slots in self._by_mapper.items()
                   for slot, size in slots.items()}
        if indexed != {(slot, size, mapper) for slot, (size, mapper) in self._slots.items()}:
            raise AssertionError("pool index drifted")
        if any(not slots for slots in self._by_mapper.values()):
            raise AssertionError("pool index keeps an empty mapper")
        if list(self._since) != list(self._slots):
            raise AssertionError("pool times drifted")

    def _unindex(self, slot: int, mapper: bytes) -> None:
        slots = self._by_mapper[mapper]
        del slots[slot]
        if not slots:
            del self._by_mapper[mapper]


def _fits(size: int, file_size: int) -> bool:
    return size <= file_size <= 2 * size + 4096
