"""``ObjectRefGenerator``: the refs a streaming generator task yields, as they come.

A remote function (or a method of a sync actor) that is a generator returns one of
these instead of a ref, as in Ray: the worker sends each value to the caller the moment
it is yielded, and iterating gives one ``ObjectRef`` per value, in order, blocking until
the next one exists. If the task raises after ``k`` values, the ``k+1``-th ref holds the
error and the iteration ends there.

    @lumos.remote
    def rollout(n):
        for step in range(n):
            yield simulate(step)

    for ref in rollout.remote(100):
        print(lumos.get(ref))
"""

from __future__ import annotations

import asyncio
import collections
import functools
import threading
import time
import types
from typing import Any

from lumos._private import interrupts
from lumos._private.ids import TaskID, return_object_id
from lumos.exceptions import GetTimeoutError, LumosSystemError
from lumos.object_ref import ObjectRef


class GeneratorStream:
    """What the owner knows of one streaming task: how many values arrived, and whether
    it ended (io thread writes, user threads read under ``cond``)."""

    __slots__ = ("task_id", "count", "finished", "cond", "taken", "dropped")

    def __init__(self, task_id: TaskID) -> None:
        self.task_id = task_id
        #: Values that arrived (their entries hold one count each until taken).
        self.count = 0
        self.finished = False
        self.cond = threading.Condition()
        #: Values handed to the user as refs.
        self.taken = 0
        #: The user's generator is gone: values that arrive later are freed at once.
        self.dropped = False


class ObjectRefGenerator:
    """Iterate (``for``, ``next()``, ``async for``) to get each yielded value's ref."""

    #: ``ObjectRef[int]`` and the like in annotations, as in Ray.
    __class_getitem__ = classmethod(types.GenericAlias)

    def __init__(self, stream: GeneratorStream, owner: Any, core_worker: Any) -> None:
        self._stream = stream
        self._owner = owner
        self._cw = core_worker

    def __iter__(self) -> "ObjectRefGenerator":
        return self

    def __next__(self) -> ObjectRef:
        ref = self._next(None)
        if ref is None:
            raise StopIteration
        return ref

    def __aiter__(self) -> "ObjectRefGenerator":
        return self

    async def __anext__(self) -> ObjectRef:
        if self._would_not_block():
            ref = self._next(None)
        else:
            ref = await asyncio.get_running_loop().run_in_executor(None, self._next, None)
        if ref is None:
            raise StopAsyncIteration
        return ref

    def next_ready(self) -> bool:
        """Whether ``next()`` would return a ref at once, whose value ``get`` returns at once;
        False at the end of the stream (``is_finished()`` tells it), as in Ray."""
        s = self._stream
        return s.taken < s.count

    def _would_not_block(self) -> bool:
        """Whether ``next()`` returns (a ref, or the end) without waiting: ``wait``'s test."""
        s = self._stream
        return s.taken < s.count or s.finished

    def is_finished(self) -> bool:
        """The task ended and every ref was handed out."""
        s = self._stream
        return s.finished and s.taken >= s.count

    def _next(self, timeout_s: float | None) -> ObjectRef | None:
        """The next ref, or None at the end; ``GetTimeoutError`` after ``timeout_s``."""
        s = self._stream
        cw = self._cw
        cw.drain_refs()
        with s.cond:
            ready = s.taken < s.count or s.finished
        if not ready:
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            cw._set_blocked(True)
            try:
                with s.cond:
                    while s.taken >= s.count and not s.finished:
                        wait_s = cw.config.wait_slice_s
                        if deadline is not None:
                            wait_s = min(wait_s, deadline - time.monotonic())
                            if wait_s <= 0:
                                raise GetTimeoutError(f"no value from the generator task within {timeout_s}s")
                        s.cond.wait(wait_s)
            finally:
                cw._set_blocked(False)
        with s.cond:
            if s.taken >= s.count:
                return None
            index = s.taken
            s.taken = index + 1
        # The entry's count held for the stream becomes this ref's.
        return ObjectRef(return_object_id(s.task_id, index + 1), self._owner, True)

    @interrupts.finalizer  # (a stop pressed while it runs: sent again after it)
    def __del__(self) -> None:
        s = self._stream
        cw = self._cw
        if cw is None or cw._closed:
            return
        try:
            cw._post(cw.drop_stream, s)
        except LumosSystemError:
            return  # shut down meanwhile: nothing left to release

    from lumos._private.compat import missing_function as _missing
    _INSTEAD = "iterate it (for, next(), async for) for the refs; drop it to stop receiving values"
    completed = _missing("ray.ObjectRefGenerator.completed", "is_finished() tells when the stream ended, and lumos.wait([gen]) when its next value "
                         "(or its end) is ready; " + _INSTEAD)
    close = _missing("ray.ObjectRefGenerator.close", _INSTEAD)
    aclose = _missing("ray.ObjectRefGenerator.aclose", _INSTEAD)
    send = _missing("ray.ObjectRefGenerator.send", _INSTEAD)
    asend = _missing("ray.ObjectRefGenerator.asend", _INSTEAD)
    throw = _missing("ray.ObjectRefGenerator.throw", _INSTEAD)
    athrow = _missing("ray.ObjectRefGenerator.athrow", _INSTEAD)
    del _missing, _INSTEAD

    def __reduce__(self) -> Any:
        raise TypeError("an ObjectRefGenerator cannot be passed to another task or stored; "
                        "pass the refs it yields (or a list of them) instead")

    def _repr_html_(self) -> str:
        """Notebook display: the task, whether it still runs, values arrived and taken."""
        s = self._stream
        state, colour = ("finished", "#1a7f37") if s.finished else ("running", "#1f6feb")
        return (f"<span class='lumos-ref'><code>ObjectRefGenerator({s.task_id.hex()[:16]}…)</code> "
                f"<span style='color:#666'><span style='color:{colour}'>{state}</span> · "
                f"{s.count} value{'s' if s.count != 1 else ''} arrived · {s.taken} taken</span></span>")

    def __repr__(self) -> str:
        s = self._stream
        state = "finished" if s.finished else "running"
        return f"ObjectRefGenerator({s.task_id.hex()[:16]}, {state}, {s.taken}/{s.count} taken)"


class DynamicObjectRefGenerator:
    """The value of a ``num_returns="dynamic"`` task (deprecated in Ray, kept for its
    programs): iterate it for one ``ObjectRef`` per value the generator yielded. If the
    generator raised, the last ref holds the error.

        @lumos.remote(num_returns="dynamic")
        def split(n):
            for i in range(n):
                yield i

        for ref in lumos.get(split.remote(3)):
            print(lumos.get(ref))

    The values are stored by the worker that ran the task, which owns them (in Ray the
    caller does): they live while their refs do, and are lost if that worker dies.
    ``num_returns="streaming"`` (the default for generators) has no such limit.
    """

    def __init__(self, refs: list[ObjectRef]) -> None:
        self._refs = collections.deque(refs)

    def __iter__(self) -> Any:
        while self._refs:
            yield self._refs.popleft()

    def __len__(self) -> int:
        return len(self._refs)

    def __repr__(self) -> str:
        return f"DynamicObjectRefGenerator({len(self._refs)} refs)"


class _DynamicReturns:
    """Runs a ``num_returns="dynamic"`` function on the worker: stores each value it
    yields and returns their refs as a ``DynamicObjectRefGenerator``."""

    def __init__(self, function: Any) -> None:
        self.function = function
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> DynamicObjectRefGenerator:
        import os
        import traceback

        from lumos._private import serialization as ser
        from lumos._private import worker_context
        from lumos.exceptions import TaskError
        cw = worker_context.require()
        refs: list[ObjectRef] = []
        try:
            result = self.function(*args, **kwargs)
            if not hasattr(result, "__iter__"):
                raise TypeError(f"{getattr(self.function, '__qualname__', 'the function')} has "
                                f"num_returns='dynamic' but returned a {type(result).__name__}, not a generator")
            for value in result:
                refs.append(cw.put(value))
        except Exception as e:
            if not refs:
                raise
            name = getattr(self.function, "__name__", "task")
            text = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None))
            err = TaskError(name, text, e, pid=os.getpid(), node_ip=cw.node_ip,
                            task_id_hex=cw.current_task_id.hex())
            try:
                refs.append(cw.put(err, _kind=ser.KIND_ERROR))
            except ser.SerializationError:
                refs.append(cw.put(TaskError(name, text, None, f"{type(e).__name__}: {e}", os.getpid(),
                                             cw.node_ip, cw.current_task_id.hex()), _kind=ser.KIND_ERROR))
        return DynamicObjectRefGenerator(refs)


__all__ = ["ObjectRefGenerator", "DynamicObjectRefGenerator"]
