"""Multi-threaded copy of large buffers into the object store.

Owned by a ``StoreClient``; called from user threads (put, task returns) with the
destination a slice of a store mapping. One memcpy thread reaches about 60% of this
machine's memory bandwidth; splitting a copy over the cores reaches the rest. A copy of
``n`` bytes runs in ``min(threads, n // threshold)`` pieces: the calling thread copies
the first piece and idle helper threads (started once, kept for the process's life) the
others. ``numpy.copyto`` releases the GIL for the copy, so the pieces do run at once.

    caller ── piece 0 ───────────────► wait for the others ─► done
    lumos-memcpy-1 ── piece 1 ──┘
    lumos-memcpy-2 ── piece 2 ──┘

Pieces start at 4 KiB boundaries of the destination, so two threads never write the
same page (each page's fault and cache lines stay with one thread).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

#: Pieces start at multiples of this (a page: no page is written by two threads).
PIECE_ALIGN = 4096


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ParallelCopier:
    """Copies buffers of at least ``threshold_bytes`` with up to ``threads`` threads."""

    def __init__(self, threads: int, threshold_bytes: int) -> None:
        #: Threads per copy, the caller's included (never more than the usable CPUs:
        #: more only adds context switches to a bandwidth-bound copy).
        self.threads = max(1, min(threads, usable_cpus()))
        self.threshold_bytes = max(PIECE_ALIGN, threshold_bytes)
        self._lock = threading.Lock()
        #: Helper threads' work queue: (dst, src, done event, error slot) or None to stop.
        self._work: queue.SimpleQueue[tuple[Any, Any, threading.Event, list[BaseException]] | None] = \
            queue.SimpleQueue()
        self._helpers: list[threading.Thread] = []

    def pieces(self, nbytes: int) -> list[tuple[int, int]]:
        """``(start, end)`` byte ranges a copy of ``nbytes`` is split into."""
        k = min(self.threads, nbytes // self.threshold_bytes)
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
            dst[:] = src
            return
        import numpy as np  # only processes that copy large buffers pay for the import
        d = np.frombuffer(dst, dtype=np.uint8)
        s = np.frombuffer(src, dtype=np.uint8)
        self._start_helpers(len(ranges) - 1)
        waits: list[tuple[threading.Event, list[BaseException]]] = []
        for a, b in ranges[1:]:
            done, err = threading.Event(), []
            self._work.put((d[a:b], s[a:b], done, err))
            waits.append((done, err))
        a, b = ranges[0]
        try:
            np.copyto(d[a:b], s[a:b])
        finally:
            for done, _ in waits:
                done.wait()
        for _, err in waits:
            if err:
                raise err[0]

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
        import numpy as np
        while True:
            item = self._work.get()
            if item is None:
                return
            d, s, done, err = item
            item = None  # hold no export of the buffers once done: the caller may unmap them
            try:
                np.copyto(d, s)
            except BaseException as e:  # handed to the caller, which raises it
                err.append(e)
            finally:
                del d, s
                done.set()

    def close(self) -> None:
        """Stop the helper threads (they hold no resources; this only ends them)."""
        with self._lock:
            helpers, self._helpers = self._helpers, []
        for _ in helpers:
            self._work.put(None)
        for t in helpers:
            t.join(timeout=5.0)
