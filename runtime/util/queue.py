"""``Queue``: a FIFO queue shared by tasks and actors (Ray's ``ray.util.queue``).

The items live in one async actor, ``_QueueActor``, which owns an ``asyncio.Queue``.
A ``Queue`` object is only that actor's handle plus ``maxsize``: it pickles, so passing
it to tasks and actors lets producers and consumers in different processes share the
same items. Every method is one actor call::

    driver / task / actor                        _QueueActor (async, num_cpus=0)
    q.put(x)      -- put.remote((x,), t) ---->    await asyncio.Queue.put(x)
    q.get()       -- get.remote(t) ---------->    await asyncio.Queue.get()
                  <- x, or Empty/Full --------

Blocking calls wait inside the actor, as coroutines on its loop, so many getters and
putters can be blocked at once (up to the actor's ``max_concurrency``, 1000 by
default). Waiters are served in the order they started waiting, as ``asyncio.Queue``
does.

Items are sent to the actor inside a tuple: a top-level ``ObjectRef`` argument would be
resolved to its value, and an ``ObjectRef`` put in the queue must come out as the same
ref.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import queue as _stdlib_queue
from collections.abc import Iterable
from typing import Any

from lumos import api
from lumos.actor import ActorClass, ActorHandle, kill
from lumos.object_ref import ObjectRef

__all__ = ["Queue", "Empty", "Full"]


class Empty(_stdlib_queue.Empty):
    """The queue had no item to give (``get_nowait``, or ``get`` past its timeout)."""


class Full(_stdlib_queue.Full):
    """The queue had no room for the item (``put_nowait``, or ``put`` past its timeout)."""


class _QueueActor:
    """Holds the items. Runs in its own worker; reached only through ``Queue``."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        #: The items; unbounded when ``maxsize <= 0``.
        self.queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)

    def qsize(self) -> int:
        return self.queue.qsize()

    def empty(self) -> bool:
        return self.queue.empty()

    def full(self) -> bool:
        return self.queue.full()

    async def put(self, boxed: tuple[Any], timeout_s: float | None = None) -> None:
        # asyncio.timeout rather than wait_for: on Python 3.11, wait_for(..., 0) cancels the
        # put before it runs and so times out even when there is room.
        try:
            async with asyncio.timeout(timeout_s):
                await self.queue.put(boxed[0])
        except TimeoutError:
            raise Full(f"the queue stayed full (maxsize={self.maxsize}) for {timeout_s}s") from None

    async def get(self, timeout_s: float | None = None) -> Any:
        try:
            async with asyncio.timeout(timeout_s):
                return await self.queue.get()
        except TimeoutError:
            raise Empty(f"the queue stayed empty for {timeout_s}s") from None

    def put_nowait(self, boxed: tuple[Any]) -> None:
        try:
            self.queue.put_nowait(boxed[0])
        except asyncio.QueueFull:
            raise Full(f"the queue is full (maxsize={self.maxsize})") from None

    def put_nowait_batch(self, items: list[Any]) -> None:
        if self.maxsize > 0 and len(items) + self.queue.qsize() > self.maxsize:
            raise Full(f"cannot put {len(items)} items into a queue holding {self.queue.qsize()} "
                       f"(maxsize={self.maxsize}); none were put")
        for item in items:
            self.queue.put_nowait(item)

    # async although it never waits: an async actor awaits whatever a plain method returns
    # that is awaitable, and an ObjectRef is, so a plain method would hand back the ref's
    # value instead of the ref.
    async def get_nowait(self) -> Any:
        try:
            return self.queue.get_nowait()
        except asyncio.QueueEmpty:
            raise Empty("the queue is empty") from None

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        if num_items > self.queue.qsize():
            raise Empty(f"cannot get {num_items} items from a queue holding {self.queue.qsize()}; "
                        "none were taken")
        return [self.queue.get_nowait() for _ in range(num_items)]


#: ``@lumos.remote(num_cpus=0)`` on ``_QueueActor``: the queue holds no CPU. Built here
#: rather than with the decorator because ``lumos/__init__`` imports this module before
#: it defines ``lumos.remote``, and so that the class keeps its importable name.
_QueueActorClass = ActorClass(_QueueActor, {"num_cpus": 0})


class Queue:
    """A first-in, first-out queue that tasks and actors share.

    Pass the ``Queue`` itself to tasks and actors; they all see the same items. Items
    are any picklable values; an ``ObjectRef`` comes out as the same ref, unresolved.

    Args:
        maxsize: the most items the queue holds; ``0`` or less means no limit.
        actor_options: options for the actor that holds the items, as for
            ``.options(...)`` (e.g. ``{"name": "jobs", "lifetime": "detached"}``). It
            takes no CPU unless ``num_cpus`` is given here.

    Raises:
        TypeError: ``maxsize`` is not an int, or ``actor_options`` is not a dict.
        ValueError: an actor option is not valid.

    Example:
        >>> q = Queue(maxsize=100)
        >>> @lumos.remote
        ... def produce(q, n):
        ...     for i in range(n):
        ...         q.put(i)
        >>> produce.remote(q, 3)
        >>> [q.get(timeout=10) for _ in range(3)]
        [0, 1, 2]
    """

    def __init__(self, maxsize: int = 0, actor_options: dict[str, Any] | None = None) -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int):
            raise TypeError(f"Queue(maxsize=...) must be an int (0 or less for no limit), "
                            f"not {type(maxsize).__name__}")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"Queue(actor_options=...) must be a dict of actor options or None, "
                            f"not {type(actor_options).__name__}")
        #: The most items the queue holds; 0 or less: no limit.
        self.maxsize = maxsize
        #: The actor holding the items; None once ``shutdown()`` ran.
        self.actor: ActorHandle | None = _QueueActorClass.options(**(actor_options or {})).remote(maxsize)

    def __len__(self) -> int:
        return self.size()

    def __repr__(self) -> str:
        state = "shut down" if self.actor is None else self.actor._actor_id_hex[:16]
        return f"Queue(maxsize={self.maxsize}, actor={state})"

    def size(self) -> int:
        """The number of items in the queue now."""
        return api.get(self._handle().qsize.remote())  # type: ignore[no-any-return]

    def qsize(self) -> int:
        """The number of items in the queue now (same as ``size()``)."""
        return self.size()

    def empty(self) -> bool:
        """Whether the queue holds no item now."""
        return api.get(self._handle().empty.remote())  # type: ignore[no-any-return]

    def full(self) -> bool:
        """Whether the queue holds ``maxsize`` items now (never, without a limit)."""
        return api.get(self._handle().full.remote())  # type: ignore[no-any-return]

    def put(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """Add ``item`` at the end of the queue.

        Args:
            item: any picklable value.
            block: wait for room when the queue is full; with ``False`` raise ``Full``
                at once (``timeout`` is then ignored).
            timeout: the most seconds to wait for room; ``None`` waits for as long as it
                takes.

        Raises:
            Full: no room, at once (``block=False``) or after ``timeout`` seconds.
            TypeError, ValueError: ``timeout`` is not a number >= 0.
            RuntimeError: the queue was shut down.

        Example:
            >>> q.put("job-1", timeout=5)
        """
        if not block:
            _unwrap(self._handle().put_nowait.remote((item,)))
            return
        timeout_s = _check_timeout(timeout)
        _unwrap(self._handle().put.remote((item,), timeout_s))

    async def put_async(self, item: Any, block: bool = True, timeout: float | None = None) -> None:
        """``put`` for async code: awaits instead of blocking the thread.

        Raises:
            Full, TypeError, ValueError, RuntimeError: as ``put``.

        Example:
            >>> await q.put_async("job-1", timeout=5)
        """
        if not block:
            await _unwrap_async(self._handle().put_nowait.remote((item,)))
            return
        timeout_s = _check_timeout(timeout)
        await _unwrap_async(self._handle().put.remote((item,), timeout_s))

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """Take the item at the front of the queue.

        Args:
            block: wait for an item when the queue is empty; with ``False`` raise
                ``Empty`` at once (``timeout`` is then ignored).
            timeout: the most seconds to wait for an item; ``None`` waits for as long as
                it takes.

        Returns:
            The oldest item.

        Raises:
            Empty: no item, at once (``block=False``) or after ``timeout`` seconds.
            TypeError, ValueError: ``timeout`` is not a number >= 0.
            RuntimeError: the queue was shut down.

        Example:
            >>> q.get(timeout=5)
            'job-1'
        """
        if not block:
            return _unwrap(self._handle().get_nowait.remote())
        timeout_s = _check_timeout(timeout)
        return _unwrap(self._handle().get.remote(timeout_s))

    async def get_async(self, block: bool = True, timeout: float | None = None) -> Any:
        """``get`` for async code: awaits instead of blocking the thread.

        Returns:
            The oldest item.

        Raises:
            Empty, TypeError, ValueError, RuntimeError: as ``get``.

        Example:
            >>> item = await q.get_async(timeout=5)
        """
        if not block:
            return await _unwrap_async(self._handle().get_nowait.remote())
        timeout_s = _check_timeout(timeout)
        return await _unwrap_async(self._handle().get.remote(timeout_s))

    def put_nowait(self, item: Any) -> None:
        """``put(item, block=False)``: add ``item`` or raise ``Full`` at once."""
        self.put(item, block=False)

    def put_nowait_batch(self, items: Iterable[Any]) -> None:
        """Add all of ``items`` at once, in order, or none of them.

        Args:
            items: an iterable of picklable values.

        Raises:
            Full: they do not all fit; nothing was added.
            TypeError: ``items`` is not iterable.
            RuntimeError: the queue was shut down.

        Example:
            >>> q.put_nowait_batch(["a", "b", "c"])
        """
        if not isinstance(items, Iterable):
            raise TypeError(f"put_nowait_batch() takes an iterable of items, not {type(items).__name__}")
        _unwrap(self._handle().put_nowait_batch.remote(list(items)))

    def get_nowait(self) -> Any:
        """``get(block=False)``: take the oldest item or raise ``Empty`` at once."""
        return self.get(block=False)

    def get_nowait_batch(self, num_items: int) -> list[Any]:
        """Take the ``num_items`` oldest items at once, or none of them.

        Args:
            num_items: how many items to take (0 or more).

        Returns:
            The items, oldest first.

        Raises:
            Empty: fewer than ``num_items`` items are in the queue; nothing was taken.
            TypeError: ``num_items`` is not an int.
            ValueError: ``num_items`` is negative.
            RuntimeError: the queue was shut down.

        Example:
            >>> q.get_nowait_batch(2)
            ['a', 'b']
        """
        if isinstance(num_items, bool) or not isinstance(num_items, int):
            raise TypeError(f"get_nowait_batch(num_items) takes an int, not {type(num_items).__name__}")
        if num_items < 0:
            raise ValueError(f"get_nowait_batch(num_items) needs num_items >= 0, got {num_items}")
        return _unwrap(self._handle().get_nowait_batch.remote(num_items))  # type: ignore[no-any-return]

    def shutdown(self, force: bool = False, grace_period_s: float = 5) -> None:
        """End the actor holding the items; the items are dropped.

        Calls blocked on the queue in other processes raise ``ActorDiedError``; this
        ``Queue`` raises ``RuntimeError`` when used again. A second call does nothing.

        Args:
            force: kill the actor at once instead of asking it to exit.
            grace_period_s: how long to wait for the actor to exit before killing it.

        Raises:
            TypeError, ValueError: ``grace_period_s`` is not a number >= 0.

        Example:
            >>> q.shutdown()
        """
        grace_s = _check_timeout(grace_period_s, "grace_period_s")
        actor, self.actor = self.actor, None
        if actor is None:
            return
        if force:
            kill(actor, no_restart=True)
            return
        done = actor.__lumos_terminate__.remote()
        ready, _ = api.wait([done], timeout=grace_s)
        if not ready:
            kill(actor, no_restart=True)

    def _handle(self) -> ActorHandle:
        actor = self.actor
        if actor is None:
            raise RuntimeError("this Queue was shut down (Queue.shutdown() ended its actor and dropped "
                               "its items); create a new Queue to go on")
        return actor


def _check_timeout(timeout: Any, name: str = "timeout") -> float | None:
    """``timeout`` as seconds for the actor, ``None`` for no limit."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"'{name}' must be a number of seconds or None, not {type(timeout).__name__}")
    if not timeout >= 0:  # also catches NaN
        raise ValueError(f"'{name}' must be a non-negative number, got {timeout!r}")
    return None if math.isinf(timeout) else float(timeout)


def _unwrap(ref: ObjectRef) -> Any:
    """The call's result; the actor's ``Empty``/``Full`` raised as plain ones."""
    try:
        return api.get(ref)
    except (Empty, Full) as e:
        raise _plain(e) from None


async def _unwrap_async(ref: ObjectRef) -> Any:
    try:
        return await ref
    except (Empty, Full) as e:
        raise _plain(e) from None


def _plain(e: Empty | Full) -> Empty | Full:
    # The actor's exception arrives as a TaskError that is also an Empty/Full, carrying
    # the actor's traceback; queue users expect the bare stdlib-style exception.
    cause = getattr(e, "cause", None)
    if isinstance(cause, (Empty, Full)):
        return cause
    return e
