"""Multi-threaded copy of large buffers into the object store.

Owned by a ``StoreClient``; called from user threads (put, task returns) with the
destination a slice of a store mapping. Splitting a large copy over the cores reaches
more of the memory bandwidth than one memcpy thread. A copy of ``n`` bytes is cut into
pieces of at least ``threshold`` bytes, up to ``PIECES_PER_THREAD`` per thread; the
calling thread and up to ``threads - 1`` helper threads (started once, kept for the
process's life) take pieces from the copy's shared list until none is left, so a thread
that the machine's other work delays copies fewer pieces instead of holding up the
end (on a loaded 2-core machine, equal halves waited for the slower thread).
``numpy.copyto`` releases the GIL for the copy, so the pieces do run at once, and a
copy in one piece (under ``2 * threshold`` bytes: on this 2-core class of machine a
1 MiB copy is no faster in two threads) lets the process's other threads run.

    caller         ── piece 0 ── piece 2 ── piece 3 ──► wait for the last ─► done
    lumos-memcpy-1 ── piece 1 ──────── piece 4 ──┘

Pieces start at 4 KiB boundaries of the destination, so two threads never write the
same page (each page's fault and cache lines stay with one thread).
"""

from __future__ import annotations

import itertools
import os
import queue
import threading
from typing import Any

#: Pieces start at multiples of this (a page: no page is written by two threads).
PIECE_ALIGN = 4096
#: Pieces per thread at most (more pieces: better balance, more hand-offs).
PIECES_PER_THREAD = 4
#: A copy in one piece of at least this many bytes runs with the GIL released.
UNLOCKED_COPY_BYTES = 64 * 1024


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Copy:
    """One copy's pieces, taken by whichever thread is free."""

    __slots__ = ("dst", "src", "ranges", "_next", "_lock", "_left", "done", "errors")

    def __init__(self, dst: Any, src: Any, ranges: list[tuple[int, int]]) -> None:
        self.dst = dst
        self.src = src
        self.ranges = ranges
        self._next = itertools.count()  # next() is atomic under the GIL
        self._lock = threading.Lock()
        self._left = len(ranges)
        #: Set when every piece is copied (or failed).
        self.done = threading.Event()
        self.errors: list[BaseException] = []

    def run(self) -> None:
        """Copy pieces until none is left to take."""
        import numpy as np
        while True:
            i = next(self._next)
            if i >= len(self.ranges):
                return
            a, b = self.ranges[i]
            try:
                np.copyto(self.dst[a:b], self.src[a:b])
            except BaseException as e:  # handed to the caller, which raises it
                self.errors.append(e)
            with self._lock:
                self._left -= 1
                if self._left == 0:
                    self.dst = self.src = None  # no export of the buffers outlives the copy
                    self.done.set()


class ParallelCopier:
    """Copies buffers of at least ``2 * threshold_bytes`` with up to ``threads`` threads."""

    def __init__(self, threads: int, threshold_bytes: int) -> None:
        #: Threads per copy, the caller's included (never more than the usable CPUs:
        #: more only adds context switches to a bandwidth-bound copy).
        self.threads = max(1, min(threads, usable_cpus()))
        self.threshold_bytes = max(PIECE_ALIGN, threshold_bytes)
        self._lock = threading.Lock()
        #: Copies for helper threads to join (None: stop).
        self._work: queue.SimpleQueue[_Copy | None] = queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []

    def pieces(self, nbytes: int) -> list[tuple[int, int]]:
        """``(start, end)`` byte ranges a copy of ``nbytes`` is split into."""
        if self.threads <= 1:
            return [(0, nbytes)]
        k = min(self.threads * PIECES_PER_THREAD, nbytes // self.threshold_bytes)
        if k <= 1:
            return [(0, nbytes)]
        step = -(-nbytes // k)
        step = -(-step // PIECE_ALIGN) * PIECE_ALIGN
        return [(s, min(s + step, nbytes)) for s in range(0, nbytes, step)]

    def copy(self, dst: memoryview, src: memoryview) -> None:
        """``dst[:] = src`` (same length, both 1-D bytes), in parallel when large."""
        n = src.nbytes
        if dst.nbytes != n:
            raise ValueError(f"copy of {n} bytes into a destination of {dst.nbytes} bytes")
        ranges = self.pieces(n)
        if len(ranges) == 1:
            if n < UNLOCKED_COPY_BYTES:
                dst[:] = src
                return
            import numpy as np
            # One thread, the GIL released (a slice assignment holds it): the process's
            # io thread runs meanwhile (a 1 MiB by-value argument's copy is ~50 us).
            np.copyto(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8))
            return
        import numpy as np  # only processes that copy large buffers pay for the import
        job = _Copy(np.frombuffer(dst, dtype=np.uint8), np.frombuffer(src, dtype=np.uint8), ranges)
        helpers = min(self.threads, len(ranges)) - 1
        self._start_helpers(helpers)
        for _ in range(helpers):
            self._work.put(job)
        job.run()
        job.done.wait()
        if job.errors:
            raise job.errors[0]

    def _start_helpers(self, n: int) -> None:
        if len(self._helpers) >= n:
            return
        with self._lock:
            while len(self._helpers) < n:
                t = threading.Thread(target=self._helper, name=f"lumos-memcpy-{len(self._helpers) + 1}",
                                     daemon=True)
                t.start()
                self._helpers.append(t)

    def _helper(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            job.run()
            job = None  # hold no export of the buffers: the caller may unmap them

    def close(self) -> None:
        """Stop the helper threads (they hold no resources; this only ends them)."""
        with self._lock:
            helpers, self._helpers = self._helpers, []
        for _ in helpers:
            self._work.put(None)
        for t in helpers:
            t.join(timeout=5.0)
