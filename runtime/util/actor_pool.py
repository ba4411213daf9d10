"""``ActorPool``: spread work over a fixed set of actors (Ray's ``ray.util.ActorPool``)."""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Iterable, Iterator

from lumos import api
from lumos.exceptions import ActorUnavailableError, ActorUnschedulableError, GetTimeoutError, RayActorError
from lumos.object_ref import ObjectRef


class ActorPool:
    """Run ``fn(actor, value)`` on whichever actor is free.

    Example:
        >>> pool = ActorPool([Worker.remote() for _ in range(4)])
        >>> list(pool.map(lambda a, v: a.double.remote(v), [1, 2, 3]))
        [2, 4, 6]
    """

    def __init__(self, actors: Iterable[Any]) -> None:
        self._idle: list[Any] = list(actors)
        #: Ref -> (submission index, actor).
        self._future_to_actor: dict[ObjectRef, tuple[int, Any]] = {}
        #: Submission index -> ref, for in-order results.
        self._index_to_future: dict[int, ObjectRef] = {}
        self._next_task_index = 0
        self._next_return_index = 0
        #: Submissions waiting for a free actor.
        self._pending: deque[tuple[Callable[[Any, Any], ObjectRef], Any]] = deque()

    def map(self, fn: Callable[[Any, Any], ObjectRef], values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, in the order of ``values``. Every value is
        submitted before this returns (as in Ray); the results of earlier submissions
        not yet read are dropped."""
        self._submit_all(fn, values)
        return self._results(self.get_next)

    def map_unordered(self, fn: Callable[[Any, Any], ObjectRef], values: Iterable[Any]) -> Iterator[Any]:
        """Results of ``fn`` over ``values``, as they finish (submitted before this returns)."""
        self._submit_all(fn, values)
        return self._results(self.get_next_unordered)

    def _submit_all(self, fn: Callable[[Any, Any], ObjectRef], values: Iterable[Any]) -> None:
        """Drop what earlier submissions left unread, then submit every value."""
        self._drop_outstanding()
        for v in values:
            self.submit(fn, v)

    def _results(self, next_result: Callable[[], Any]) -> Iterator[Any]:
        while self.has_next():
            yield next_result()

    def _drop_outstanding(self) -> None:
        while self.has_next():
            try:
                self.get_next_unordered()
            except Exception:  # as in Ray: a dropped result's error is not raised
                pass

    def submit(self, fn: Callable[[Any, Any], ObjectRef], value: Any) -> None:
        """Schedule ``fn(actor, value)`` on a free actor (or when one frees up)."""
        if self._idle:
            actor = self._idle.pop()
            ref = fn(actor, value)
            if not isinstance(ref, ObjectRef):
                self._idle.append(actor)
                raise TypeError(f"the function given to ActorPool must return an ObjectRef "
                                f"(actor.method.remote(...)), not {type(ref).__name__}")
            self._future_to_actor[ref] = (self._next_task_index, actor)
            self._index_to_future[self._next_task_index] = ref
            self._next_task_index += 1
        else:
            self._pending.append((fn, value))

    def has_next(self) -> bool:
        """Whether results are outstanding (submissions waiting for an actor count once one
        of the pool's actors runs something: a pool with no live actor has none, as in Ray)."""
        return bool(self._future_to_actor)

    def get_next(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """The next result in submission order. After ``timeout`` seconds a
        ``GetTimeoutError`` (a ``TimeoutError``); with ``ignore_if_timedout`` that result
        is skipped first (its actor goes back to the pool), as in Ray."""
        if not self.has_next():
            raise StopIteration("no more results to get")
        if self._next_return_index >= self._next_task_index:
            raise ValueError("it is not allowed to call get_next() after get_next_unordered()")
        ref = self._index_to_future[self._next_return_index]
        ready, _ = api.wait([ref], timeout=timeout)
        if not ready:
            if not ignore_if_timedout:
                raise GetTimeoutError("timed out waiting for the next result")
            del self._index_to_future[self._next_return_index]
            self._next_return_index += 1
            self._return_actor(self._future_to_actor.pop(ref)[1])
            raise GetTimeoutError(f"timed out waiting for the next result; the task {ref.hex()} has been "
                                  "ignored")
        del self._index_to_future[self._next_return_index]
        self._next_return_index += 1
        _, actor = self._future_to_actor.pop(ref)
        return self._result(ref, actor)

    def get_next_unordered(self, timeout: float | None = None, ignore_if_timedout: bool = False) -> Any:
        """Whichever outstanding result finishes first. After ``timeout`` seconds a
        ``GetTimeoutError``; ``ignore_if_timedout`` is accepted for Ray's signature (nothing
        is skipped: no one result is the next)."""
        if not self.has_next():
            raise StopIteration("no more results to get")
        ready, _ = api.wait(list(self._future_to_actor), num_returns=1, timeout=timeout)
        if not ready:
            raise GetTimeoutError("timed out waiting for the next result")
        ref = ready[0]
        index, actor = self._future_to_actor.pop(ref)
        self._index_to_future.pop(index, None)
        self._next_return_index = max(self._next_return_index, index + 1)
        return self._result(ref, actor)

    def _result(self, ref: ObjectRef, actor: Any) -> Any:
        """``ref``'s value (ready); its actor goes back to the pool, unless the call found
        it dead for good: then it leaves the pool, as in Ray (it failed every later call).
        One that is restarting (ActorUnavailableError) stays."""
        try:
            value = api.get(ref)
        except (RayActorError, ActorUnschedulableError) as e:
            if isinstance(e, ActorUnavailableError):
                self._return_actor(actor)
            else:
                self._run_pending()
            raise
        self._return_actor(actor)
        return value

    def _return_actor(self, actor: Any) -> None:
        self._idle.append(actor)
        self._run_pending()

    def _run_pending(self) -> None:
        while self._pending and self._idle:
            fn, value = self._pending.popleft()
            self.submit(fn, value)

    def has_free(self) -> bool:
        """Whether an actor is idle."""
        return bool(self._idle) and not self._pending

    def pop_idle(self) -> Any | None:
        """Take an idle actor out of the pool (None if none is idle)."""
        return self._idle.pop() if self.has_free() else None

    def push(self, actor: Any) -> None:
        """Add an actor to the pool."""
        busy = {id(a) for _, a in self._future_to_actor.values()}
        if id(actor) in busy or any(a is actor for a in self._idle):
            raise ValueError("the actor is already in the pool")
        self._return_actor(actor)


__all__ = ["ActorPool"]
