"""Worker output of ``%%remote`` tasks, routed to the cell that submitted them.

Owner: the ``OutputRouter`` singleton of the extension. It installs itself as the
worker-output handler (``lumos.util.output.set_handler``; called on the ``lumos-io``
thread with batches of ``[job, task_id, task_name, pid, is_stderr, text]`` records,
plus ``root_task_id`` for nested tasks) and hands the records of registered tasks to
that cell's ``CellSink``; other records go to the handler it replaced (printed with a
prefix).

```
 worker print ─► raylet ─► GCS pub/sub ─► lumos-io: OutputRouter.handle
                                             │ task registered?     └─ no: previous handler
                                             ▼
                           CellSink.feed ─► live: queue ─► notebook main thread writes the
                                                           lines into the running cell
                                        └─► late: LiveDisplay in the submitting cell
                                                  (a display handle, updated by a thread)
```
Nothing here blocks the io thread: it appends to a queue or to a display's buffer.
"""

from __future__ import annotations

import collections
import logging
import queue
import sys
import threading
import time
from typing import Any, Callable

from lumos.kernelext.cell import decode_display, display_prefix, end_prefix
from lumos.util import output

logger = logging.getLogger(__name__)

#: Items on a sink's queue.
OUT, ERR, DISPLAY, END, DONE = "out", "err", "display", "end", "done"


class CellSink:
    """Output of one cell run (one task, or several for ``--map``).

    Only lines that carry the run's ``nonce`` are display bundles or end markers; any
    other line, whatever it starts with, is text the cell printed.
    """

    def __init__(self, nonce: str, labels: dict[bytes, str] | None = None) -> None:
        self._display = display_prefix(nonce)
        self._end = end_prefix(nonce)
        self._nonce = nonce
        #: task id -> prefix for its lines ("" for a single task).
        self.labels = labels or {}
        self.queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        #: While True the notebook's main thread drains ``queue`` into the running cell.
        self._live = True
        #: Where output goes once the cell returned (None: the wrapped handler prints it).
        self._late: Any = None
        self._late_fallback: Callable[[list[Any]], None] | None = None
        #: map indices whose END_MARKER arrived.
        self.ended: set[int] = set()

    def feed(self, task_id: bytes, is_stderr: bool, text: str, rec: list[Any]) -> None:
        """io thread: one record of the task ``task_id``."""
        prefix = self.labels.get(task_id, "")
        items: list[tuple[str, Any]] = []
        plain: list[str] = []
        for line in text.split("\n"):
            if line.startswith("\ue000") and not is_stderr:
                if line.startswith(self._display):
                    bundle = decode_display(line, self._nonce)
                    if bundle is not None:
                        if plain:
                            items.append((OUT, "".join(plain)))
                            plain = []
                        items.append((DISPLAY, bundle))
                        continue
                elif line.startswith(self._end):
                    try:
                        index = int(line[len(self._end):])
                    except ValueError:
                        index = None
                    if index is not None:
                        if plain:
                            items.append((OUT, "".join(plain)))
                            plain = []
                        items.append((END, index))
                        continue
            plain.append(prefix + line + "\n")
        if plain:
            items.append((ERR if is_stderr else OUT, "".join(plain)))
        with self._lock:
            for kind, value in items:
                if kind == END:
                    self.ended.add(value)
            if self._live:
                for item in items:
                    self.queue.put(item)
                return
            late = self._late
        if late is not None:
            for kind, value in items:
                if kind in (OUT, ERR):
                    late.append_text(value, kind == ERR)
                elif kind == DISPLAY:
                    late.append_bundle(value)
        elif self._late_fallback is not None:
            texts = [v for k, v in items if k in (OUT, ERR)]
            if texts:
                self._late_fallback([[rec[0], task_id, rec[2], rec[3], is_stderr, "".join(texts).rstrip("\n")]])

    def done(self) -> None:
        """Any thread: the cell's tasks finished (wakes the waiting main thread)."""
        self.queue.put((DONE, None))

    def go_late(self, target: Any, fallback: Callable[[list[Any]], None] | None) -> None:
        """The cell returned: later output goes to ``target`` (a LiveDisplay) or ``fallback``.

        Items still queued are handed to the target too.
        """
        with self._lock:
            self._live = False
            self._late = target
            self._late_fallback = fallback
            pending = []
            while True:
                try:
                    pending.append(self.queue.get_nowait())
                except queue.Empty:
                    break
        for kind, value in pending:
            if target is not None:
                if kind in (OUT, ERR):
                    target.append_text(value, kind == ERR)
                elif kind == DISPLAY:
                    target.append_bundle(value)

    def drain(self, deadline: float, stop: Callable[[], bool]) -> None:
        """Main thread: write queued output into the running cell until ``stop()`` or ``deadline``.

        Ctrl-C raises ``KeyboardInterrupt`` here (the wait is in short slices).
        """
        while True:
            if stop():
                self._write_pending()
                if stop():
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            try:
                first = self.queue.get(timeout=min(remaining, 0.1))
            except queue.Empty:
                continue
            self._write_all([first, *self._take_queued()])

    def _take_queued(self, most: int = 100_000) -> list[tuple[str, Any]]:
        items: list[tuple[str, Any]] = []
        while len(items) < most:
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return items

    def _write_pending(self) -> None:
        while True:
            items = self._take_queued()
            if not items:
                return
            self._write_all(items)

    def _write_all(self, items: list[tuple[str, Any]]) -> None:
        """Write what was queued, the text of a run of one stream as one write and one
        flush: a flush per line made a message per line on the kernel's iopub socket,
        which drops messages past its high-water mark (a cell printing 200,000 lines
        lost a tenth of them, in silence)."""
        run: list[str] = []
        run_kind = ""
        for kind, value in items:
            if kind in (OUT, ERR):
                if run and kind != run_kind:
                    self._write(run_kind, "".join(run))
                    run = []
                run_kind = kind
                run.append(value)
                continue
            if run:
                self._write(run_kind, "".join(run))
                run = []
            self._write(kind, value)
        if run:
            self._write(run_kind, "".join(run))

    def _write(self, kind: str, value: Any) -> None:
        if kind == OUT:
            sys.stdout.write(value)
            sys.stdout.flush()
        elif kind == ERR:
            sys.stderr.write(value)
            sys.stderr.flush()
        elif kind == DISPLAY:
            from IPython.display import display
            display(value.get("data", {}), metadata=value.get("metadata") or None, raw=True)


class OutputRouter:
    """Task id -> sink. Installed as the worker-output handler (once per ``lumos.init()``)."""

    def __init__(self, max_routes: int = 20_000) -> None:
        self._routes: collections.OrderedDict[bytes, CellSink] = collections.OrderedDict()
        #: Task name -> sink, while a cell's tasks are being submitted: a fast task prints
        #: before ``register`` knows its id (its output, and its end marker, went to the
        #: plain printer, and the cell waited out its grace for the marker).
        self._expected: dict[str, CellSink] = {}
        self._lock = threading.Lock()
        self._max = max_routes
        self._previous: Callable[[list[Any]], None] | None = None

    def install(self) -> None:
        """Become the output handler of this process's cluster connection (a no-op when
        it already is, or before ``lumos.init()``)."""
        current = output.get_handler()
        if current is None or getattr(current, "__self__", None) is self:
            return
        self._previous = output.set_handler(self.handle)

    def uninstall(self) -> None:
        prev = self._previous
        if prev is not None and getattr(output.get_handler(), "__self__", None) is self:
            output.set_handler(prev)

    def expect(self, name: str, sink: CellSink) -> None:
        """Route output of tasks named ``name`` to ``sink`` until ``settled(name)``."""
        self._expected[name] = sink

    def settled(self, name: str) -> None:
        self._expected.pop(name, None)

    def register(self, task_id: bytes, sink: CellSink) -> None:
        with self._lock:
            self._routes[task_id] = sink
            while len(self._routes) > self._max:
                self._routes.popitem(last=False)

    def print_fallback(self, lines: list[Any]) -> None:
        prev = self._previous
        if prev is not None:
            prev(lines)

    def handle(self, lines: list[Any]) -> None:
        """io thread: a batch of worker output records."""
        rest = []
        routes = self._routes
        for rec in lines:
            sink = routes.get(rec[1])
            if sink is None and len(rec) > 6 and rec[6]:
                sink = routes.get(rec[6])  # a nested task of a cell: its root is the cell's task
            if sink is None and self._expected:
                sink = self._expected.get(rec[2])  # a cell's task, before its id is registered
            if sink is None:
                rest.append(rec)
                continue
            try:
                sink.feed(rec[1], bool(rec[4]), str(rec[5]), rec)
            except Exception:
                logger.exception("routing worker output failed")
        if rest and self._previous is not None:
            self._previous(rest)


#: The extension's router (one per kernel process).
ROUTER = OutputRouter()
