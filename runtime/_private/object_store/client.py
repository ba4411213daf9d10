"""A process's window onto its node's object store: write, map, view.

Owned by the core worker; called from user threads (put, get, task execution), never
from the event loop, because copies of large buffers are slow. Space is granted by the
raylet (``ObjectStoreState``); this class only creates, maps and renames files.

Writes go to ``<id>.w`` and are renamed to ``<id>`` when complete, so a file under its
final name is always sealed. A process keeps the writable mapping of what it created
while the object lives (its own gets are views of it; a task's return is kept by slot)
and, when the raylet pools the slot, keeps it for the next create of that slot: those
writes hit already-faulted pages. Views handed to user code are read-only and tracked (``_Mapping.live_views``)
so a slot is never reused while any view of it is alive.

Reserved slots: the raylet grants a process a few files ahead of its puts
(``ReserveSlots``); a pooled file is mapped and pre-faulted in the ``lumos-store-map``
thread, a new one created there (``_fresh_mapping``) and pre-faulted only once the
process's writes pause (``prefault``), and a put writes one, moves it to the object's
name (``move_noreplace``: never over an existing object) and seals it one way. A new file
taken before that gets its first value with one gather write (``write_fresh``: its pages
are allocated as they are written, never zeroed first nor faulted in one by one, ~40%
less CPU for fresh memory), and is mapped afterwards if this process will read it or
write the slot again. The raylet may take an unused one back
(``DropSlots``); a write that loses that race finds its link refused and creates instead.

Spilling: the raylet spills only objects no process views. Each process reports when
its count of live views of an object leaves zero and when it returns to zero
(``on_pin``), drops cached mappings of spilled objects when told (``drop_mappings``),
and asks for a restore when an object's store file is missing (``restore``).

Spare read mappings: a worker's task arguments are often files it mapped before (the
same object passed by ref again, or a pooled slot its writer reused for the next
value). A task's argument mapping with no view left is kept after the task, with its
file open (``keep_spare``), keyed by the file's inode; a later argument whose file
(found by ``stat`` of its name) is that inode reuses the mapping: no open, mmap,
munmap or page faults. A kept file the raylet has unlinked (``st_nlink`` 0, the oldest
few checked after a task, every few milliseconds) is unmapped then, so its pages are not held, and an idle worker
drops its spares after a second (``drop_spares``).

A value read with ``view(spare=True)`` (the core worker's ``get``: a driver reading task
returns in a loop meets the few files its workers' pooled slots recycle) keeps its file
open too, while at most ``SPARE_MAPPINGS`` such live values do; its mapping becomes a
spare once the object is released and its last view has gone, and the ``lumos-store-spares``
thread drops spares unused for ``SPARE_IDLE_S``, so an idle process holds no store pages.

Lent slots: a task's argument passed by value, on its way to a worker on this node, is
written into a reserved slot that stays this process's (``write_lent``): the file is
renamed ``lent-<slot>`` once (a name the raylet never unlinks while this process lives)
and named to the worker by its slot, with no seal, no free and no rename at the raylet.
Once the task is done the slot is reserved again for the next argument (``reclaim``),
unless the worker kept views of the value past its task or the argument must become an
object the raylet serves (a worker on another node): then it is linked under the
object's name and sealed like a reserved put (``publish``). The worker maps ``lent-<slot>``
(``view(lent_slot=...)``); its views send no pins (the raylet does not know the value)
and its executor reports, with the reply, the arguments it still views (``viewed``).
A slot the raylet takes back while lent is unlinked here once its task is done.

Held pins: a task's arguments stay alive while it runs (their owner releases them only
after its reply), so the executor holds back the pins of argument views (``hold_pins``)
and, once the task returned, pins only those whose views outlive it
(``escaped_pins``), with a round trip before the reply. The usual argument, viewed and
dropped within its task, costs no message to the raylet. While held, the raylet may
spill such an object; the process's mapping stays valid (the file's pages live until
it is unmapped), only the raylet's count of them is short for the task's duration.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import itertools
import logging
import mmap
import os
import queue
import threading
import time
import weakref
from typing import Any, Callable

from lumos._private import interrupts
from lumos._private.process import libc

from .memcpy import ParallelCopier

logger = logging.getLogger(__name__)


#: Spare read mappings a process keeps (``keep_spare``), and their bytes at most (a
#: writer cycles through its reserved and pooled slots: 16 to 24 of 1 MiB values).
SPARE_MAPPINGS = 32
SPARE_BYTES = 64 * 1024 * 1024
#: Spares whose files are checked after a task, oldest first (a removed file's spare is
#: never used again, so it drifts to the oldest end), at most once per
#: ``SPARE_CHECK_INTERVAL_S``: a worker running 1 MiB by-value tasks back to back made
#: four ``fstat`` calls a task (~4 us of its ~65 us of CPU) for files still there.
SPARE_CHECKS = 4
SPARE_CHECK_INTERVAL_S = 0.005
#: Spares of read values (``view(spare=True)``) unused this long are dropped.
SPARE_IDLE_S = 1.0
#: A new reserved slot still untaken once this long went by since it was made and since
#: the process last took a slot is pre-faulted in the background (``StoreClient.prefault``);
#: one taken before is written with one gather write (``write_fresh``).
PREFAULT_AFTER_S = 0.003
#: New slots the mapping thread remembers for ``prefault`` before it forgets those taken.
PREFAULT_TRACKED = 64


class _Mapping:
    __slots__ = ("mm", "size", "live_views", "slot", "object_id", "path", "fd", "ino", "value_fd",
                 "lent", "private", "given", "__weakref__")

    def __init__(self, mm: mmap.mmap, size: int, slot: int, object_id: bytes = b"", path: str = "") -> None:
        self.mm = mm
        self.size = size
        #: Read-only views of this mapping still referenced by user code.
        self.live_views = 0
        self.slot = slot
        self.object_id = object_id
        #: A reserved slot's file (``resv-<slot>``), linked to the object's name when written.
        self.path = path
        #: A spare-able read mapping's open file (``keep_spare``) and its inode; -1: none.
        self.fd = -1
        self.ino = -1
        #: A live read value's open file, counted in ``StoreClient._value_fds``.
        self.value_fd = False
        #: A read mapping of another process's lent slot: its views send no pins.
        self.lent = False
        #: A copy-on-write read mapping (``_map_readonly``): writes stay in this process.
        self.private = False
        #: Given to one value for writing in place (``writable``): out of ``_read``, never
        #: a spare, gone with its last view.
        self.given = False


class SlotsBySize:
    """Slot -> value (a file size, or a mapping of it), grouped by file size as well:
    counting the slots that fit a size, or taking one, costs a step per distinct file
    size, not per slot. A burst of 1 MiB by-value arguments leaves hundreds of slots of
    one size reserved in the driver (its lent slots come back as the tasks end), and a
    count that walked them all took a quarter of the caller's GIL time in such a burst."""

    __slots__ = ("_by_slot", "_by_size", "_size_of")

    def __init__(self, size_of: Callable[[Any], int]) -> None:
        self._by_slot: dict[int, Any] = {}
        #: File size -> {slot: value}, in the order the slots came.
        self._by_size: dict[int, dict[int, Any]] = {}
        self._size_of = size_of

    def __len__(self) -> int:
        return len(self._by_slot)

    def __contains__(self, slot: int) -> bool:
        return slot in self._by_slot

    def __setitem__(self, slot: int, value: Any) -> None:
        self.pop(slot)
        self._by_slot[slot] = value
        self._by_size.setdefault(self._size_of(value), {})[slot] = value

    def pop(self, slot: int, default: Any = None) -> Any:
        value = self._by_slot.pop(slot, _MISSING)
        if value is _MISSING:
            return default
        size = self._size_of(value)
        group = self._by_size[size]
        del group[slot]
        if not group:
            del self._by_size[size]
        return value

    def get(self, slot: int) -> Any:
        return self._by_slot.get(slot)

    def values(self) -> list[Any]:
        return list(self._by_slot.values())

    def clear(self) -> None:
        self._by_slot.clear()
        self._by_size.clear()

    def count_fitting(self, size: int) -> int:
        """How many slots fit ``size`` bytes (``_fits``)."""
        return sum(len(group) for file_size, group in self._by_size.items() if _fits(size, file_size))

    def last_fitting(self, size: int) -> tuple[int, Any] | None:
        """The slot that came last among those of the first file size that fits ``size``,
        with its value: a slot back from a lent argument is the next one lent (see
        ``StoreClient.take_reserved``)."""
        for file_size, group in self._by_size.items():
            if _fits(size, file_size):
                return next(reversed(group.items()))
        return None


_MISSING = object()


class StoreClient:
    """Creates and maps object files in one node's store directory."""

    def __init__(self, directory: str, memcpy_threads: int, memcpy_threshold_bytes: int,
                 recycle_bytes: int) -> None:
        self.directory = directory
        #: ``directory`` and a separator: an object's path is this and its id in hex
        #: (``os.path.join`` and ``dirname`` were ~15% of a task argument's view).
        self._prefix = os.path.join(directory, "")
        #: Copies of large buffers into the store, split over the cores.
        self.copier = ParallelCopier(memcpy_threads, memcpy_threshold_bytes)
        self._recycle_bytes = recycle_bytes
        # Reentrant: a view's weakref callback may run inside a locked region (GC).
        self._lock = threading.RLock()
        #: Object id -> writable mapping of a file this process created.
        self._created: dict[bytes, _Mapping] = {}
        #: Object id -> read-only mapping of a file another process created.
        self._read: dict[bytes, _Mapping] = {}
        #: Object id -> live views of it in this process (any mapping).
        self._pins: dict[bytes, int] = {}
        #: Called with (object id, True) when this process's first live view of an object
        #: appears and (object id, False) when its last one goes (any thread).
        self.on_pin: Callable[[bytes, bool], None] | None = None
        #: Asks the raylet to bring a missing object back (user threads): None (gone), ""
        #: (back in the store) or the spill file to map.
        self.restore: Callable[[bytes], str | None] | None = None
        #: Called (any thread) with an owned object's id when it was freed while this
        #: process still viewed it and its last view has gone: free it in the store now.
        self.on_free_later: Callable[[bytes], None] | None = None
        #: Object id -> mapping of an owned object freed while viewed here.
        self._deferred: dict[bytes, tuple[_Mapping, bool]] = {}
        #: Slot -> mapping kept after free, for the next create of that slot.
        self._slots: dict[int, _Mapping] = {}
        self._slot_bytes = 0
        #: Reserved slots granted by the raylet -> file size (mapped or being mapped).
        self._resv_sizes = SlotsBySize(int)
        #: Reserved slots mapped and ready for a put: slot -> mapping.
        self._reserved = SlotsBySize(_file_size)
        #: Reserved slots lent to a task (``write_lent``): slot -> mapping, from the
        #: ``take_reserved`` that took it until ``reclaim`` or ``publish``.
        self._lending: dict[int, _Mapping] = {}
        #: Lent values by object id (the same mappings, once written).
        self._lent: dict[bytes, _Mapping] = {}
        #: Lent slots the raylet took back meanwhile: unlinked here when their task is done.
        self._lent_dropped: set[int] = set()
        #: Puts written into reserved slots.
        self.reserved_writes = 0
        #: Arguments written into lent slots, and slots reserved again after their task.
        self.lent_writes = 0
        self.lent_reclaimed = 0
        #: Reserved slots mapped as new files, and as pooled files this process had no
        #: mapping of (each page faulted in again): the costly ways to get a slot.
        self.reserved_created = 0
        self.reserved_remapped = 0
        #: Maps reserved slots (started with the first reservation) from ``_to_map``: a
        #: plain thread and queue (a ``ThreadPoolExecutor.submit`` cost the io thread
        #: ~10 us per reservation, a tenth of its time under 1 MiB by-value arguments).
        self._mapper: threading.Thread | None = None
        self._to_map: queue.SimpleQueue[list[Any] | None] = queue.SimpleQueue()
        #: When a reserved slot was last taken (``take_reserved``): the mapping thread
        #: pre-faults new slots only once this process's writes pause (``prefault``).
        self._last_take = 0.0
        #: weakref callbacks need the ctypes views alive only through user references.
        self._weak: dict[int, weakref.ref[Any]] = {}
        #: Mappings whose last view went while unmapping is deferred (``defer_unmaps``):
        #: kept until ``unmap_deferred``. None: unmap at once.
        self._unmap_later: list[mmap.mmap] | None = None
        #: Objects whose first view's pin is held back (``hold_pins``); None: not holding.
        self._held: set[bytes] | None = None
        #: Held objects whose pin is on its way (``escaped_pins``) -> their views all went
        #: meanwhile (the unpin follows the pin).
        self._pinning: dict[bytes, bool] = {}
        #: Read mappings of task arguments, to keep as spares after the task.
        self._to_spare: list[_Mapping] = []
        #: Spare read mappings: inode -> mapping (no views, file open), oldest first.
        self._spare: collections.OrderedDict[int, _Mapping] = collections.OrderedDict()
        self._spare_bytes = 0
        #: ``time.monotonic()`` before which ``_settle_spares`` checks no files.
        self._next_spare_check = 0.0
        #: Argument views served by a spare mapping.
        self.spare_hits = 0
        #: Live read values (``view(spare=True)``) holding their file open: at most
        #: ``SPARE_MAPPINGS``, so a process holding many values holds few fds.
        self._value_fds = 0
        #: When a spare was last added or used; the thread dropping idle spares.
        self._spare_used = 0.0
        self._spare_thread: threading.Thread | None = None
        self._spare_wake = threading.Event()
        #: The thread waits with no deadline (no spares then): a new spare wakes it.
        self._spare_idle_waiting = False
        self._closed = False
        #: Smallest view ``writable`` gives (0: none): a smaller one is copied, so that it
        #: does not keep its whole object pinned in the store.
        self.in_place_min_bytes = 64 * 1024

    # ------------------------------------------------------------------ writing

    def write(self, object_id: bytes, grant_path: str, final_path: str, slot: int,
              file_size: int, reused: bool, size: int,
              fill: Callable[[memoryview, Callable[[memoryview, memoryview], None]], None],
              keep_mapping: bool, pieces: Callable[[], list[Any]] | None = None) -> None:
        """Write ``size`` bytes through ``fill(dest, copy)`` (a new file: ``pieces()`` in
        one gather write, ``_fill``) and seal by renaming.

        ``keep_mapping``: this process will read the object (it owns it), so keep the
        writable mapping for views and for reuse of the slot.
        """
        with self._lock:
            mapping = self._slots.pop(slot, None)
            if mapping is not None:
                self._slot_bytes -= mapping.size
        if mapping is not None and mapping.size >= size:
            pass  # the slot's pages, mapped here since its last value
        elif not reused and slot >= 0 and pieces is not None:
            mapping = _fresh_mapping(grant_path, file_size, slot)
        else:
            fd = open_object_file(grant_path, create=not reused)
            try:
                if not reused:
                    os.ftruncate(fd, file_size)
                    # Allocates the pages now: a full /dev/shm is an OSError here rather
                    # than a SIGBUS in the copy, and allocating them in one call is
                    # cheaper than one page fault per page (1 MiB: ~20% less).
                    os.posix_fallocate(fd, 0, file_size)
                # slot < 0: a file in the spill dir (on disk: nothing to map ahead).
                flags = mmap.MAP_SHARED | (mmap.MAP_POPULATE if slot >= 0 else 0)
                mm = mmap.mmap(fd, file_size, flags=flags)
            finally:
                os.close(fd)
            mapping = _Mapping(mm, file_size, slot)
        mapping.object_id = object_id
        if not self._fill(mapping, size, fill, pieces, keep_mapping or self._room_to_keep(mapping)):
            raise FileNotFoundError(errno.ENOENT, "the store file to write is gone", grant_path)
        mapping.path = ""
        os.rename(grant_path, final_path)
        self._keep(object_id, mapping, keep_mapping)

    # ------------------------------------------------------------------ reserved slots

    def reservations(self, size: int) -> int:
        """Reserved slots (ready or being mapped) that fit ``size`` bytes."""
        with self._lock:
            return self._resv_sizes.count_fitting(size)

    def reserved_granted(self, grants: list[Any]) -> None:
        """The raylet granted these slots (io thread, in message order, so a later
        ``DropSlots`` of one finds it here)."""
        with self._lock:
            for slot, _, file_size, _ in grants:
                self._resv_sizes[slot] = file_size

    def map_reserved_soon(self, grants: list[Any]) -> None:
        """``reserved_granted``; a pooled slot this process still maps at its size is
        ready at once (no syscall: the raylet handed back a file we wrote), the others
        go to ``map_reserved`` in the store's mapping thread (waking it cost the io
        thread ~15 us and the mapper as much again per reservation under 1 MiB by-value
        arguments, where nearly every grant is such a slot)."""
        self.reserved_granted(grants)
        rest = []
        with self._lock:
            for grant in grants:
                slot, path, file_size, reused = grant
                mapping = self._slots.get(slot) if reused else None
                if mapping is None or mapping.size != file_size or slot not in self._resv_sizes:
                    rest.append(grant)
                    continue
                del self._slots[slot]
                self._slot_bytes -= mapping.size
                mapping.path = path
                self._reserved[slot] = mapping
            if not rest:
                return
            grants = rest
            if self._mapper is None:
                self._mapper = threading.Thread(target=self._map_loop, name="lumos-store-map", daemon=True)
                self._mapper.start()
        self._to_map.put(grants)

    def _map_loop(self) -> None:
        #: New slots made here and not written yet, oldest first, with when they were made.
        fresh: collections.deque[tuple[float, _Mapping]] = collections.deque()
        while True:
            try:
                if fresh:
                    wait = max(fresh[0][0], self._last_take) + PREFAULT_AFTER_S - time.monotonic()
                    grants = self._to_map.get(timeout=wait) if wait > 0 else self._to_map.get_nowait()
                else:
                    grants = self._to_map.get()
            except queue.Empty:
                self.prefault(fresh.popleft()[1])  # (one at a time: new grants are not kept waiting)
                continue
            if grants is None:
                return
            try:
                now = time.monotonic()
                fresh.extend((now, mapping) for mapping in self.map_reserved(grants))
                if len(fresh) > PREFAULT_TRACKED:  # (a long burst takes them as they come)
                    with self._lock:
                        fresh = collections.deque(e for e in fresh if e[1].mm is None
                                                  and self._reserved.get(e[1].slot) is e[1])
            except Exception:  # top of the thread's loop: log, keep mapping later grants
                logger.exception("mapping reserved store slots failed")

    def prefault(self, mapping: _Mapping) -> None:
        """Mapping thread: a new reserved slot still untaken once ``PREFAULT_AFTER_S`` went
        by with no slot taken (the process's writes paused) is allocated and mapped now
        (``fallocate``, a populating ``mmap``), so a write into it later is a copy into
        faulted pages. One taken before is written with one gather write (``_fill``), the
        cheaper way to fresh memory in CPU: in a burst of writes the CPU that pre-faulting
        takes is the writers' (it took back half of what the gather writes saved in a
        burst of 1 MiB returns when it ran on each slot left 3 ms untaken); between a
        workload's rounds the slots wait, and their pages are made ready meanwhile."""
        with self._lock:
            if self._reserved.get(mapping.slot) is not mapping or mapping.mm is not None:
                return  # taken (or back with the raylet)
            self._reserved.pop(mapping.slot)  # (out of reach while it is mapped here)
        try:
            fd = open_object_file(mapping.path, create=False)
            try:
                mapping.mm = _allocate_and_map(fd, mapping.size)
            finally:
                os.close(fd)
        except OSError as e:  # gone (taken back), or a full /dev/shm: the writer's write says so
            logger.debug("could not pre-fault reserved slot %d: %s", mapping.slot, e)
        with self._lock:
            if mapping.slot in self._resv_sizes:
                self._reserved[mapping.slot] = mapping
                return
        unlink_quietly(mapping.path)  # taken back meanwhile: a file we made after its unlink is ours
        self._close(mapping)

    def map_reserved(self, grants: list[Any]) -> list[_Mapping]:
        """Map and pre-fault granted pooled slots, and create new ones (a background
        thread: off the put path). Returns the new slots, for ``prefault`` later."""
        fresh = []
        for slot, path, file_size, reused in grants:
            with self._lock:
                if slot not in self._resv_sizes:
                    continue  # taken back already
                mapping = self._slots.pop(slot, None) if reused else None
                if mapping is not None:
                    self._slot_bytes -= mapping.size
            try:
                if mapping is None or mapping.size != file_size:
                    if mapping is not None:
                        self._close(mapping)
                    if reused:
                        mapping = _Mapping(_map_new(path, file_size, create=False), file_size, slot)
                        self.reserved_remapped += 1
                    else:
                        mapping = _fresh_mapping(path, file_size, slot)
                        self.reserved_created += 1
            except OSError as e:
                # Taken back before we opened it, or /dev/shm is full: the raylet takes
                # the slot back under pressure or when we go.
                logger.debug("could not map reserved slot %d: %s", slot, e)
                with self._lock:
                    self._resv_sizes.pop(slot, None)
                if not reused and e.errno != errno.ENOENT:
                    unlink_quietly(path)
                continue
            mapping.path = path
            with self._lock:
                if slot in self._resv_sizes:
                    self._reserved[slot] = mapping
                    if mapping.mm is None:
                        fresh.append(mapping)
                    continue
            # Taken back while we mapped it: a file we made after its unlink is ours to remove.
            if not reused:
                unlink_quietly(path)
            self._close(mapping)
        return fresh

    def take_reserved(self, size: int, lend: bool = False) -> _Mapping | None:
        """A mapped reserved slot that fits ``size`` bytes, now this caller's, or None.
        ``lend``: for ``write_lent`` (a take-back of the slot from now on is noted).

        The slot that came back last goes first: a loop of calls with a by-value argument
        writes the same few slots, whose pages are in the cache, and the worker reads
        them through the mapping it kept of that file (its spare), where taking the
        oldest first went round every slot the bursts had left reserved (hundreds, for
        1 MiB arguments), a fresh mmap and munmap in the worker per call (by-value
        bursts ran 10-30% slower)."""
        if not self._reserved:
            return None
        self._last_take = time.monotonic()
        with self._lock:
            found = self._reserved.last_fitting(size)
            if found is None:
                return None
            slot, mapping = found
            self._reserved.pop(slot)
            self._resv_sizes.pop(slot)
            if lend:
                self._lending[slot] = mapping
            return mapping

    def lent_path(self, slot: int) -> str:
        return f"{self._prefix}lent-{slot}"

    def write_lent(self, object_id: bytes, mapping: _Mapping, size: int,
                   fill: Callable[[memoryview, Callable[[memoryview, memoryview], None]], None],
                   pieces: Callable[[], list[Any]] | None = None) -> bool:
        """Write a task's by-value argument into a slot ``take_reserved(lend=True)`` gave,
        lent under ``lent-<slot>`` until ``reclaim`` or ``publish``. False when the raylet
        took the slot back before it was ever lent (its file is gone): write it otherwise."""
        written = self._fill(mapping, size, fill, pieces, True)
        lent = self.lent_path(mapping.slot)
        if not written or mapping.path != lent:
            try:
                if not written:
                    raise FileNotFoundError(mapping.path)
                os.rename(mapping.path, lent)  # (never over a file: lent-<slot> names only this slot)
            except FileNotFoundError:
                with self._lock:
                    self._lending.pop(mapping.slot, None)
                    self._lent_dropped.discard(mapping.slot)
                self._close(mapping)
                return False
            mapping.path = lent
        mapping.object_id = object_id
        with self._lock:
            self._lent[object_id] = mapping
        self.lent_writes += 1
        return True

    def reclaim(self, object_id: bytes) -> bool:
        """A lent argument's task is done and no worker views it: its slot is reserved
        again (or, taken back meanwhile, its file unlinked). False: not lent here."""
        with self._lock:
            mapping = self._lent.pop(object_id, None)
            if mapping is None:
                return False
            slot = mapping.slot
            self._lending.pop(slot, None)
            dropped = slot in self._lent_dropped
            if dropped:
                self._lent_dropped.discard(slot)
            else:
                mapping.object_id = b""
                self._reserved[slot] = mapping
                self._resv_sizes[slot] = mapping.size
                self.lent_reclaimed += 1
        if dropped:
            unlink_quietly(mapping.path)
            self._close(mapping)
        return True

    def publish(self, object_id: bytes) -> tuple[int, int] | None:
        """Make a lent argument a store object: its file linked under the object's name
        (a worker's mapping of it stays valid). Returns (slot, file size) for its reserved
        seal; None when it is not lent here. Its mapping is kept as a put's is."""
        with self._lock:
            mapping = self._lent.pop(object_id, None)
            if mapping is None:
                return None
            self._lending.pop(mapping.slot, None)
            self._lent_dropped.discard(mapping.slot)
        try:
            move_noreplace(mapping.path, self._prefix + object_id.hex())
        except OSError as e:  # removed from under us: whoever needs it finds it lost
            logger.warning("lent argument %s: %s could not become its object: %s",
                           object_id.hex(), mapping.path, e)
            self._close(mapping)
            return None
        mapping.path = ""
        with self._lock:
            self._created[object_id] = mapping
        return mapping.slot, mapping.size

    def viewed(self, object_ids: list[bytes]) -> list[bytes]:
        """Those of ``object_ids`` this process still has live views of."""
        with self._lock:
            return [oid for oid in object_ids if self._pins.get(oid, 0) > 0]

    def write_reserved(self, object_id: bytes, mapping: _Mapping, size: int,
                       fill: Callable[[memoryview, Callable[[memoryview, memoryview], None]], None],
                       keep_mapping: bool, pieces: Callable[[], list[Any]] | None = None) -> bool:
        """Write into a reserved slot and link it under the object's final name. False
        when that failed (the slot was taken back, or the object exists): create instead."""
        # A task's return is mapped too while its slot stays with this process for reuse
        # (``_keep``): the slot's next value here is then a copy into faulted pages.
        if not self._fill(mapping, size, fill, pieces, keep_mapping or self._room_to_keep(mapping)):
            self._close(mapping)
            return False
        try:
            move_noreplace(mapping.path, self._prefix + object_id.hex())
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOENT):
                raise
            self._close(mapping)
            return False
        mapping.object_id = object_id
        self.reserved_writes += 1
        self._keep(object_id, mapping, keep_mapping)
        return True

    def _keep(self, object_id: bytes, mapping: _Mapping, keep_mapping: bool) -> None:
        if mapping.mm is None:  # a new file written and not mapped (``_fill``): nothing to keep
            return
        if keep_mapping:
            with self._lock:
                self._created[object_id] = mapping
            return
        if mapping.slot >= 0:
            # Another process owns it (a task's return): keep the faulted pages for the
            # slot's next create here. The raylet says DropSlot when the file goes.
            with self._lock:
                if self._room_to_keep(mapping) and mapping.slot not in self._slots:
                    self._slots[mapping.slot] = mapping
                    self._slot_bytes += mapping.size
                    return
        self._close(mapping)

    def _room_to_keep(self, mapping: _Mapping) -> bool:
        """``_keep`` would keep ``mapping`` for its slot's next value here (a store slot,
        within ``recycle_bytes``)."""
        return mapping.slot >= 0 and self._slot_bytes + mapping.size <= self._recycle_bytes

    def _copy(self, dst: memoryview, src: memoryview) -> None:
        self.copier.copy(dst, src)

    def _fill(self, mapping: _Mapping, size: int,
              fill: Callable[[memoryview, Callable[[memoryview, memoryview], None]], None],
              pieces: Callable[[], list[Any]] | None, map_after: bool) -> bool:
        """Lay a value out in ``mapping``'s file: through its mapping, or, for a new file
        (``_fresh_mapping``: not mapped), with one gather write of ``pieces()``, mapped
        afterwards only when ``map_after`` (this process reads it, or writes the slot
        again; a task's return is neither). See ``write_fresh``. False: the new file is
        gone (the raylet took the slot back)."""
        if mapping.mm is not None:
            with memoryview(mapping.mm) as dest:
                fill(dest[:size], self._copy)
            return True
        try:
            fd = open_object_file(mapping.path, create=False)
        except FileNotFoundError:
            return False
        try:
            if pieces is None:
                mapping.mm = _allocate_and_map(fd, mapping.size)
                with memoryview(mapping.mm) as dest:
                    fill(dest[:size], self._copy)
                return True
            write_fresh(fd, pieces(), size, mapping.size)
            if map_after:
                mapping.mm = mmap.mmap(fd, mapping.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
            return True
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ reading

    def view(self, object_id: bytes, restore: bool = True, hold_pin: bool = False,
             spare: bool = False, lent_slot: int = -1) -> memoryview | None:
        """A read-only view of a sealed object in this node's store, or None if absent.

        A spilled object is restored first (blocks on the raylet; user threads only).
        ``restore=False``: the caller knows the object lives on another node; do not ask.
        ``hold_pin``: a task's argument; while pins are held (``hold_pins``) its pin
        waits for ``escaped_pins``. ``spare``: a value read (``get``): its mapping may
        become a spare once the object is released and its views are gone.
        ``lent_slot``: a task's argument its owner lent in that slot's file (no pins).

        The stop button is held off meanwhile (``interrupts.hold``), but for the wait
        on a restore: landing between the pin the view counts and the weakref that gives
        it back, it left the object pinned in the store for the process's life."""
        stretch = interrupts.hold()
        try:
            with self._lock:
                mapping = self._created.get(object_id) or self._read.get(object_id)
                if mapping is not None:
                    return self._tracked_view(mapping, hold_pin)
            path: str | None = self._prefix + object_id.hex() if lent_slot < 0 else self.lent_path(lent_slot)
            for _ in range(8):  # a restored copy may be spilled again before we map it
                assert path is not None
                mapping = self._map_readonly(object_id, path, hold_pin or spare)
                if mapping is not None:
                    mapping.lent = lent_slot >= 0
                    break
                if self.restore is None or not restore or lent_slot >= 0:
                    return None
                with interrupts.Window():  # (a wait on the raylet, nothing half done: the stop button works)
                    path = self.restore(object_id)
                if path is None:
                    return None
                if not path:
                    path = self._prefix + object_id.hex()
            else:
                return None
            with self._lock:
                held = self._read.setdefault(object_id, mapping)
                if held is not mapping:  # another thread mapped it meanwhile
                    self._close(mapping)
                elif spare and mapping.fd >= 0:
                    if self._value_fds < SPARE_MAPPINGS:
                        mapping.value_fd = True
                        self._value_fds += 1
                    else:  # fds stay bounded: this one never becomes a spare
                        fd, mapping.fd = mapping.fd, -1
                        os.close(fd)
                return self._tracked_view(held, hold_pin)
        finally:
            if stretch:
                interrupts.release()

    def _map_readonly(self, object_id: bytes, path: str, spare: bool = False) -> _Mapping | None:
        """Map a sealed object file read-only. ``spare``: a task's argument in the store
        directory: reuse a spare mapping of the same file, or keep the file open so the
        mapping may become one."""
        prefix = self._prefix
        spare = spare and path.startswith(prefix) and path.find(os.sep, len(prefix)) < 0
        if spare and self._spare:
            try:
                st = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                return None
            with self._lock:
                mapping = self._spare.pop(st.st_ino, None)
                if mapping is not None:
                    self._spare_bytes -= mapping.size
                    if mapping.size == st.st_size and mapping.live_views == 0:
                        mapping.object_id = object_id
                        self.spare_hits += 1
                        self._spare_used = time.monotonic()
                        return mapping
            if mapping is not None:
                self._close(mapping)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            st = os.fstat(fd)
            if st.st_size == 0:
                return None
            # Copy-on-write (never written: pages stay shared) because the view tracker's
            # ctypes exporter needs a writable buffer; what users get is read-only.
            mapping = _Mapping(mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY), st.st_size, 0, object_id)
            mapping.private = True
            if spare:
                mapping.fd, mapping.ino, fd = fd, st.st_ino, -1
            return mapping
        finally:
            if fd >= 0:
                os.close(fd)

    def _tracked_view(self, mapping: _Mapping, hold_pin: bool = False) -> memoryview:
        # A ctypes array over the mapping is the exporter every derived view keeps
        # alive; its death (all user views gone) decrements live_views. Lock held.
        arr = (ctypes.c_char * mapping.size).from_buffer(mapping.mm)
        mapping.live_views += 1
        oid = mapping.object_id
        n = self._pins.get(oid, 0)
        self._pins[oid] = n + 1
        quiet = mapping.lent  # a lent argument: the raylet does not know it
        if n == 0 and not quiet:
            if hold_pin and self._held is not None:
                self._held.add(oid)
            elif self.on_pin is not None:
                self.on_pin(oid, True)
        lock = self._lock
        ref = weakref.ref(mapping)

        def gone(w: Any, ref: Any = ref, oid: bytes = oid, mm: mmap.mmap = mapping.mm, quiet: bool = quiet) -> None:
            self._weak.pop(id(w), None)
            m = ref()
            with lock:
                later = self._unmap_later
                if later is not None:
                    later.append(mm)  # the munmap, if this was the last reference, waits
                if m is not None:
                    m.live_views -= 1
                left = self._pins.get(oid, 1) - 1
                if left > 0:
                    self._pins[oid] = left
                    return
                self._pins.pop(oid, None)
                if quiet:
                    return  # a lent argument: never pinned, never freed from here
                if self._held is not None and oid in self._held:
                    self._held.discard(oid)  # never pinned: nothing to undo
                elif oid in self._pinning:
                    self._pinning[oid] = True  # unpinned once its pin went
                elif self.on_pin is not None:
                    self.on_pin(oid, False)
                deferred = self._deferred.pop(oid, None)
                if deferred is None:
                    return
                mapping, created = deferred
                # A mapping we wrote is kept for the slot's next create; a read-only one
                # becomes a spare (a value read with its file open) or goes with this view.
                if created and self._slot_bytes + mapping.size <= self._recycle_bytes:
                    self._slots[mapping.slot] = mapping
                    self._slot_bytes += mapping.size
                elif not created and mapping.fd >= 0:
                    self._settle_spares([mapping], 1)  # one value at a time: one check keeps up
                    self._spares_kept()
                if self.on_free_later is not None:
                    self.on_free_later(oid)

        w = weakref.ref(arr, gone)
        self._weak[id(w)] = w
        arr._lumos_store = (self, ref)   # for ``writable``
        return memoryview(arr).cast("B").toreadonly()

    def writable(self, view: memoryview, exporter: Any) -> memoryview | None:
        """A writable view of the bytes of ``view`` (part of a read-only view from
        ``view()``, whose exporter is ``exporter``), for a value rebuilt to be changed in
        place without a copy (a torch tensor); None when the caller must copy.

        A copy-on-write read mapping that no other live view shares is given to the
        value: its pages are the store's until written, and a write copies the page into
        this process alone. The mapping leaves ``_read``, so a later read of the object
        maps the file afresh and never sees those writes, and it never becomes a spare.
        An object this process wrote (a shared, writable mapping) gets a private mapping
        of its file for the value instead (one per read: the other views of the read use
        it too). Either way the views keep the object pinned as before: the store's pages
        under them stay as they are."""
        if not 0 < self.in_place_min_bytes <= view.nbytes:
            return None
        start = _address(view) - ctypes.addressof(exporter)
        ref = exporter._lumos_store[1]
        with self._lock:
            mapping = ref()
            if mapping is None:
                return None
            if not mapping.private:
                own = getattr(exporter, "_lumos_private", None)
                if own is None:
                    own = self._private_copy_of(mapping)
                    if own is None:
                        return None
                    exporter._lumos_private = own
                return memoryview(own).cast("B")[start:start + view.nbytes]
            if not mapping.given:
                oid = mapping.object_id
                if mapping.live_views != 1 or self._read.get(oid) is not mapping:
                    return None
                del self._read[oid]
                self._uncount(mapping)
                mapping.given = True
                if mapping.fd >= 0:
                    fd, mapping.fd = mapping.fd, -1
                    os.close(fd)
        return memoryview(exporter).cast("B")[start:start + view.nbytes]

    def _private_copy_of(self, mapping: _Mapping) -> Any:
        """A tracked (pinning) copy-on-write mapping of the file of an object this process
        wrote, given to a value alone; its ctypes exporter, or None (lock held)."""
        oid = mapping.object_id
        if not oid or self._created.get(oid) is not mapping:
            return None
        try:
            fd = os.open(self._prefix + oid.hex(), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != mapping.size:
                return None
            private = _Mapping(mmap.mmap(fd, mapping.size, access=mmap.ACCESS_COPY), mapping.size, 0, oid)
        finally:
            os.close(fd)
        private.private = private.given = True
        return self._tracked_view(private).obj

    def hold_pins(self) -> None:
        """Until ``escaped_pins``, views made with ``hold_pin`` send no pin (a task's
        arguments, alive until its reply)."""
        with self._lock:
            if self._held is None:
                self._held = set()

    def escaped_pins(self, pin: Callable[[list[bytes]], None]) -> None:
        """Stop holding pins; ``pin(ids)`` (which must reach the raylet before it
        returns) the held objects still viewed: views that outlive the task."""
        with self._lock:
            held, self._held = self._held, None
            escaped = [oid for oid in held if self._pins.get(oid, 0) > 0] if held else []
            for oid in escaped:
                self._pinning[oid] = False
        if not escaped:
            return
        try:
            pin(escaped)
        finally:
            with self._lock:
                gone = [oid for oid in escaped if self._pinning.pop(oid, False)]
                on_pin = self.on_pin
            if on_pin is not None:
                for oid in gone:
                    on_pin(oid, False)

    def defer_unmaps(self) -> None:
        """Until ``unmap_deferred``, a mapping whose last view goes is kept mapped (its pins
        are released at once, as always): the executor sends a task's reply first."""
        with self._lock:
            if self._unmap_later is None:
                self._unmap_later = []

    def unmap_deferred(self) -> None:
        """Drop the mappings kept since ``defer_unmaps`` (the munmaps happen here) and unmap
        at once again; keep the task's argument mappings that no view uses as spares, and
        unmap spares whose files the raylet removed."""
        with self._lock:
            later, self._unmap_later = self._unmap_later, None
            keep, self._to_spare = self._to_spare, []
        del later
        if keep or self._spare:
            self._settle_spares(keep)

    def keep_spare(self, object_id: bytes) -> None:
        """A task's argument is read (its views keep what they need): after the task,
        keep its mapping as a spare if no view uses it then (``unmap_deferred``)."""
        with self._lock:
            mapping = self._read.pop(object_id, None)
            if mapping is None:
                return
            if mapping.fd >= 0 and self._unmap_later is not None:
                self._to_spare.append(mapping)
                return
        self._close(mapping)

    def has_spares(self) -> bool:
        return bool(self._spare)

    def _uncount(self, mapping: _Mapping) -> None:
        """A live read value leaves ``_read`` (lock held)."""
        if mapping.value_fd:
            mapping.value_fd = False
            self._value_fds -= 1

    def _spares_kept(self) -> None:
        """Value spares were kept (lock held): start or wake the thread that drops them
        after ``SPARE_IDLE_S`` unused (an executor drops its argument spares itself)."""
        if not self._spare or self._closed:
            return
        self._spare_used = time.monotonic()
        if self._spare_thread is None:
            self._spare_thread = threading.Thread(target=self._drop_idle_spares,
                                                  name="lumos-store-spares", daemon=True)
            self._spare_thread.start()
        elif self._spare_idle_waiting:  # else it looks again when its deadline comes
            self._spare_idle_waiting = False
            self._spare_wake.set()

    def _drop_idle_spares(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                wait = self._spare_used + SPARE_IDLE_S - time.monotonic() if self._spare else None
                self._spare_idle_waiting = wait is None
            if wait is not None and wait <= 0:
                self.drop_spares()
                continue
            self._spare_wake.wait(wait)
            self._spare_wake.clear()

    def drop_spares(self) -> None:
        """Unmap every spare mapping (an idle worker keeps none)."""
        with self._lock:
            spares = list(self._spare.values())
            self._spare.clear()
            self._spare_bytes = 0
        for mapping in spares:
            self._close(mapping)

    def _settle_spares(self, keep: list[_Mapping], checks: int = SPARE_CHECKS) -> None:
        """Keep these mappings as spares (caps permitting); unmap the oldest ``checks``
        spares whose files the raylet removed (unless the last check was less than
        ``SPARE_CHECK_INTERVAL_S`` ago)."""
        drop: list[_Mapping] = []
        if self._spare:
            now = time.monotonic()
            if now < self._next_spare_check:
                checks = 0
            else:
                self._next_spare_check = now + SPARE_CHECK_INTERVAL_S
        for ino, mapping in list(itertools.islice(self._spare.items(), checks)):
            try:
                gone = os.fstat(mapping.fd).st_nlink == 0
            except OSError:
                gone = True
            if gone:
                with self._lock:
                    if self._spare.get(ino) is mapping:
                        del self._spare[ino]
                        self._spare_bytes -= mapping.size
                        drop.append(mapping)
        with self._lock:
            for mapping in keep:
                if mapping.live_views > 0 or mapping.ino in self._spare or mapping.size > SPARE_BYTES:
                    drop.append(mapping)
                    continue
                self._spare[mapping.ino] = mapping
                self._spare_bytes += mapping.size
                while len(self._spare) > SPARE_MAPPINGS or self._spare_bytes > SPARE_BYTES:
                    _, old = self._spare.popitem(last=False)
                    self._spare_bytes -= old.size
                    drop.append(old)
        for mapping in drop:
            self._close(mapping)

    def drop_mappings(self, object_ids: list[bytes]) -> None:
        """These objects left the store (spilled): unmap them. A mapping with live views
        stays valid (the file is immutable) and goes with its last view."""
        with self._lock:
            gone = [m for oid in object_ids
                    for m in (self._read.pop(oid, None), self._created.pop(oid, None)) if m is not None]
            for m in gone:
                self._uncount(m)
            if self._slots:
                ids = set(object_ids)
                for slot, m in list(self._slots.items()):
                    if m.object_id in ids:  # a return we wrote: its file left the store
                        del self._slots[slot]
                        self._slot_bytes -= m.size
                        gone.append(m)
        for mapping in gone:
            self._close(mapping)

    def contains_local(self, object_id: bytes) -> bool:
        return object_id in self._created or os.path.exists(os.path.join(self.directory, object_id.hex()))

    # ------------------------------------------------------------------ freeing

    def release(self, object_id: bytes, shared: bool) -> bool | None:
        """The object is freed: drop or pool our mapping. True if this process views it no
        more and the slot may be reused; the raylet also checks that no other process
        views it (pins). ``shared``: we do not own it (a borrowed value): never reused.

        None: the owner still views it here (``x = get(f.remote())`` keeps the array past
        the ref); ``on_free_later`` tells when the last view goes, so the slot can be
        reused then instead of the file being unlinked now."""
        with self._lock:
            viewed = self._pins.get(object_id, 0) > 0
            read = self._read.pop(object_id, None)
            mapping = self._created.pop(object_id, None)
            held = mapping or read
            if viewed and not shared and self.on_free_later is not None and held is not None \
                    and held.slot >= 0:
                self._deferred[object_id] = (held, mapping is not None)
                if read is not None:
                    self._uncount(read)
                    if read.fd >= 0 and mapping is not None:  # the mapping alone stays
                        fd, read.fd = read.fd, -1
                        os.close(fd)
                return None
            if mapping is None:
                # Written by another process (a task's return), which keeps the slot.
                recyclable = not shared and not viewed
            else:
                recyclable = (not shared and mapping.live_views == 0
                              and self._slot_bytes + mapping.size <= self._recycle_bytes)
                if recyclable:
                    self._slots[mapping.slot] = mapping
                    self._slot_bytes += mapping.size
            if read is not None:
                self._uncount(read)
        if read is not None:
            if read.fd >= 0 and read.live_views == 0:
                self._settle_spares([read], 1)  # a value read here: a spare for its file's next use
                with self._lock:
                    self._spares_kept()
            else:
                self._close(read)
        if mapping is not None and not recyclable:
            self._close(mapping)
        return recyclable

    def drop_slot(self, slot: int) -> None:
        """The raylet unlinked a pooled or reserved slot: unmap it so its pages are released
        (a lent one once its task is done: ``reclaim``)."""
        with self._lock:
            if slot in self._lending:
                self._lent_dropped.add(slot)
                return
            mapping = self._slots.pop(slot, None)
            if mapping is not None:
                self._slot_bytes -= mapping.size
            elif self._resv_sizes.pop(slot, None) is not None:
                mapping = self._reserved.pop(slot, None)
                if mapping is not None:
                    # Ours if we created it after the raylet's unlink ran (names are never reused).
                    unlink_quietly(mapping.path)
        if mapping is not None:
            self._close(mapping)

    def _close(self, mapping: _Mapping) -> None:
        if mapping.fd >= 0:
            fd, mapping.fd = mapping.fd, -1
            os.close(fd)
        if mapping.mm is not None:
            self._close_mm(mapping.mm)

    @staticmethod
    def _close_mm(mm: mmap.mmap) -> None:
        try:
            mm.close()
        except BufferError:
            pass  # user views remain; the mapping goes when they do

    def close(self) -> None:
        with self._lock:
            maps = [m.mm for m in self._created.values()] + [m.mm for m in self._slots.values()]
            maps += [m.mm for m in self._reserved.values() if m.mm is not None]
            maps += [m.mm for m in self._lending.values() if m.mm is not None]
            spares = list(self._spare.values()) + self._to_spare + list(self._read.values())
            self._spare.clear()
            self._to_spare = []
            self._spare_bytes = 0
            self._reserved.clear()
            self._resv_sizes.clear()
            self._lending.clear()
            self._lent.clear()
            self.on_pin = None
            self.restore = None
            self._created.clear()
            self._deferred.clear()
            self._slots.clear()
            self._read.clear()
            self._slot_bytes = 0
            self._unmap_later = None
            self._value_fds = 0
            self._closed = True
            spare_thread, self._spare_thread = self._spare_thread, None
            mapper, self._mapper = self._mapper, None
        if mapper is not None:
            self._to_map.put(None)  # grants still queued find their slots taken back
            mapper.join(timeout=10.0)
        if spare_thread is not None:
            self._spare_wake.set()
            spare_thread.join(timeout=10.0)
        for mm in maps:
            self._close_mm(mm)
        for mapping in spares:
            self._close(mapping)
        self.copier.close()

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"created": len(self._created), "read": len(self._read),
                    "pooled_slots": len(self._slots), "pooled_bytes": self._slot_bytes,
                    "reserved_slots": len(self._resv_sizes), "ready_reserved_slots": len(self._reserved),
                    "spare_mappings": len(self._spare), "spare_hits": self.spare_hits,
                    "reserved_writes": self.reserved_writes, "reserved_created": self.reserved_created,
                    "lent_slots": len(self._lending), "lent_writes": self.lent_writes,
                    "lent_reclaimed": self.lent_reclaimed,
                    "reserved_remapped": self.reserved_remapped}


def _address(view: memoryview) -> int:
    """The address of a view's first byte."""
    import numpy as np
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _file_size(mapping: _Mapping) -> int:
    return mapping.size


def _fits(size: int, file_size: int) -> bool:
    """The raylet's rule for reusing a file (``slot_pool``): no more than half wasted."""
    return size <= file_size <= 2 * size + 4096


#: Buffers per ``pwritev`` call (the system's ``IOV_MAX`` is 1024).
PWRITE_PIECES = 512


def _fresh_mapping(path: str, file_size: int, slot: int) -> _Mapping:
    """A slot's new file, sized and not mapped: its first value is written into it with
    ``write_fresh`` (``StoreClient._fill``), unless ``StoreClient.prefault`` maps it first.
    Its file is not held open (a process reserving many sizes would hold many fds)."""
    fd = open_object_file(path, create=True)
    try:
        os.ftruncate(fd, file_size)
    finally:
        os.close(fd)
    return _Mapping(None, file_size, slot, path=path)  # type: ignore[arg-type]


def write_fresh(fd: int, pieces: list[Any], size: int, file_size: int) -> None:
    """Write a value (``pieces``, ``size`` bytes in all) at the start of a new store file
    of ``file_size`` bytes, then allocate the rest of the file.

    A gather write into a new tmpfs file allocates each page as it copies into it; the
    other way, ``fallocate`` (each page allocated and zeroed), a populating ``mmap`` and a
    copy through the mapping, cost ~1.6x the CPU for fresh memory (1 MiB: ~630 against
    ~380 us on this class of virtual machine, where a page costs ~1.5 us to allocate and
    ~1.3 us more to fault in; ~490 us with the mapping made afterwards). The rest of the
    file is allocated too (``fallocate``): no page of a store file is left to allocate
    later, when a full ``/dev/shm`` would be a ``SIGBUS`` in whoever touches it."""
    pos = 0
    while pieces:
        group = pieces[:PWRITE_PIECES]
        want = sum(map(len, group))
        done = os.pwritev(fd, group, pos)
        pos += done
        if done == want:
            pieces = pieces[PWRITE_PIECES:]
            continue
        for k, piece in enumerate(group):  # a short write: go on from where it stopped
            if done < len(piece):
                pieces = [memoryview(piece)[done:]] + group[k + 1:] + pieces[PWRITE_PIECES:]
                break
            done -= len(piece)
    if pos != size:
        raise ValueError(f"wrote {pos} bytes of a value of {size}")
    if size < file_size:
        os.posix_fallocate(fd, size, file_size - size)


def _map_new(path: str, file_size: int, create: bool) -> mmap.mmap:
    """Map a store file writable, its pages allocated and faulted in now."""
    fd = open_object_file(path, create=create)
    try:
        if create:
            os.ftruncate(fd, file_size)
            return _allocate_and_map(fd, file_size)
        return mmap.mmap(fd, file_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)
    finally:
        os.close(fd)


def _allocate_and_map(fd: int, file_size: int) -> mmap.mmap:
    """Allocate a store file's pages (a full ``/dev/shm`` is an ``OSError`` here, not a
    ``SIGBUS`` later) and map it writable with every page faulted in."""
    os.posix_fallocate(fd, 0, file_size)
    return mmap.mmap(fd, file_size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE)


_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
#: ``renameat2`` from the C library, or None where it is missing or the file system
#: refused the flag once (then a link and an unlink do the same in two steps).
_renameat2: Any = getattr(libc(), "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int


def move_noreplace(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, never over an existing ``dst`` (``FileExistsError``).

    One ``renameat2(RENAME_NOREPLACE)``: a file under its final name is always complete,
    and no other process's object is ever replaced. Where the kernel or file system
    lacks it: ``link`` (which never replaces either), then ``unlink`` of ``src``."""
    global _renameat2
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
            raise OSError(err, os.strerror(err), src, None, dst)
        _renameat2 = None
    os.link(src, dst)
    try:
        os.unlink(src)
    except FileNotFoundError:
        pass  # the raylet took a reserved slot back after our link: the object's name holds it


def open_object_file(path: str, create: bool) -> int:
    """Open an object file for writing, never through a symlink (``O_NOFOLLOW``).

    ``create``: make a new file (``O_EXCL``); a stale one of ours under that name (a
    crashed writer's, whose unlink is still queued) is removed first. Otherwise the
    file is a pooled slot the raylet renamed to ``path``.
    """
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
    if not create:
        return os.open(path, flags)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        os.unlink(path)  # the directory is ours alone (0700, checked by the raylet)
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o600)


def unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if e.errno != errno.ENOENT:
            logger.warning("could not remove %s: %s", path, e)


# Every view's ``gone`` shares one code object: a finalizer (``interrupts.finalizer``).
interrupts.finalizer_code(next(c for c in StoreClient._tracked_view.__code__.co_consts
                               if getattr(c, "co_name", None) == "gone"))
