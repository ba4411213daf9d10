"""Streaming generator tasks (``num_returns="streaming"``) on the owner's side.

Owns nothing of its own: the open streams live in ``CoreWorker.streams`` (task id ->
``GeneratorStream``, the user's ``ObjectRefGenerator`` reads it under its condition).
This mixin holds the io-thread code that fills them: each ``GeneratorItem`` the
executor sends becomes an owned object and the stream's next value; the final reply
(or a failure) ends the stream, an error becoming the value after the last one.

```
 executor ── GeneratorItem(i) ──► _handle_generator_item ─► _stream_item ─► entry READY, stream.count = i+1
          ── TaskReply ─────────► _finish_task ─► _finish_stream ─► _end_stream (finished, error value)
 user: ObjectRefGenerator.__next__ waits on stream.cond;  dropped generator ─► drop_stream
```
"""

from __future__ import annotations

from typing import Any

from lumos._private.core_worker.references import PENDING, READY
from lumos._private.core_worker.tasks import DONE, PendingTask
from lumos._private.ids import TASK_ID_SIZE, return_object_id
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection
from lumos.generator import GeneratorStream

#: A finished streaming task's event names at most this many of its values.
STREAM_IDS_IN_EVENTS = 1000
#: Streams of at most this many values keep their lineage (their values can be rebuilt).
STREAM_LINEAGE_MAX_VALUES = 10_000


class StreamsMixin:
    """``CoreWorker``'s streaming-generator handlers (io thread unless noted)."""

    streams: dict[bytes, GeneratorStream]
    tasks: dict[bytes, PendingTask]
    objects: Any
    raylet: Any

    def _handle_generator_item(self, conn: Connection, msg: m.GeneratorItem) -> None:
        ret = msg.item
        if type(msg.index) is not int or msg.index < 0 or type(ret) is not m.ReturnObject \
                or type(msg.task_id) is not bytes or len(msg.task_id) != TASK_ID_SIZE \
                or ret.object_id != return_object_id(msg.task_id, msg.index + 1) \
                or (ret.data is None) == (ret.node_id is None) or type(ret.size) is not int \
                or not isinstance(ret.data or ret.node_id, bytes) or type(ret.nested_refs) is not list \
                or not all(type(r) is list and len(r) == 2 and type(r[0]) is bytes and type(r[1]) is m.Address
                           for r in ret.nested_refs):
            raise ValueError("malformed GeneratorItem")
        task = self.tasks.get(msg.task_id)
        stream = self.streams.get(msg.task_id)
        if task is None or task.state == DONE:
            self._free_orphan_items([ret])
        elif stream is not None:
            self._stream_item(stream, msg.index, ret)
        else:  # a finished stream run again from its lineage: refill the values lost
            e = self.objects.entries.get(ret.object_id)
            if e is not None and e.state == PENDING:
                self._complete_item(ret)
            else:
                self._free_orphan_items([ret])

    def _stream_item(self, stream: GeneratorStream, index: int, ret: m.ReturnObject) -> None:
        """A streaming task's value number ``index`` arrived (io thread)."""
        if stream.dropped:
            self._free_orphan_items([ret])
            return
        if index != stream.count:
            return  # sent again by a retried run (the first copy stays), or out of order
        with self.objects.lock:
            self.objects.add_owned(ret.object_id)  # the stream's count, handed to the user's ref
        self._complete_item(ret)
        with stream.cond:
            stream.count = index + 1
            stream.cond.notify_all()

    def _complete_item(self, ret: m.ReturnObject) -> None:
        """Record a streamed value in its (owned) entry and wake who waits for it."""
        objects = self.objects
        nested = [(r[0], r[1]) for r in ret.nested_refs] if ret.nested_refs else None
        if nested:
            objects.add_contained(nested, registered=True)
        e = objects.complete(ret.object_id, READY, ret.data, ret.node_id, ret.size, nested)
        if e is not None:
            e.shared = True
            self._run_callbacks(ret.object_id, e)

    def _end_stream(self, task: PendingTask, error_blob: bytes | None = None) -> GeneratorStream | None:
        """A streaming task ended; an error becomes the value after the last one (io thread)."""
        stream = self.streams.pop(task.spec.task_id, None)
        if stream is None:
            return None
        if error_blob is not None:
            oid = return_object_id(task.spec.task_id, stream.count + 1)
            self._stream_item(stream, stream.count, m.ReturnObject(oid, error_blob, len(error_blob), None, []))
        with stream.cond:
            stream.finished = True
            stream.cond.notify_all()
        return stream

    def drop_stream(self, stream: GeneratorStream) -> None:
        """The user's generator went away: release the values it did not take (io thread).
        A running task's later values are freed as they arrive (``dropped``)."""
        with stream.cond:
            stream.dropped = True
            untaken = range(stream.taken, stream.count)
            stream.taken = stream.count
        for index in untaken:
            self.objects.decrements.append(return_object_id(stream.task_id, index + 1))
        self.drain_refs()

    def _free_orphan_items(self, returns: list[m.ReturnObject]) -> None:
        ids = [r.object_id for r in returns if r.data is None and r.node_id is not None
               and r.object_id not in self.objects.entries]
        if ids and self.raylet is not None:
            self.raylet.notify(m.FreeObjects(ids, [False] * len(ids)))

    def _finish_stream(self, task: PendingTask, reply: m.TaskReply) -> None:
        task.state = DONE
        self.tasks.pop(task.spec.task_id, None)
        # The error that ended it, if any, becomes the value after the last one delivered
        # (a retried run may fail before reaching the values an earlier run sent).
        error = reply.returns[0].data if reply.app_error and reply.returns else None
        stream = self._end_stream(task, error)
        info = None
        if stream is not None:  # (None: a lineage re-run; its values were completed as they came)
            ids = [return_object_id(task.spec.task_id, i + 1) for i in range(stream.count)]
            # The values it made, for the task graph and the state API (the first ones only:
            # a graph of more would not be read), and for lineage (short streams only).
            info = {"returns": ids[:STREAM_IDS_IN_EVENTS]}
            task.return_ids = ids if len(ids) <= STREAM_LINEAGE_MAX_VALUES else []
        if not reply.app_error and task.retries_left != 0:
            self._keep_lineage(task)
        self._task_done(task, reply, info)
