"""Placement loops that wait for room, woken together in a fixed order.

Actors and placement groups that fit nowhere yet wait for a node to join or for room to
free. Each loop waiting on its own timer (or on an event, in the order its waits began)
made the one that happened to look first after a change take the room: a restarting
actor lost its unit to an actor created after it, a group to a later group. Here a loop
waits for its turn (``Turns.wait``); a node joining (``Turns.wake``) and one shared timer
resolve the waiters in the order ``order`` gives (the actors' or groups' registration
order). Each loop resumes in that order and runs to its first suspension, which sends its
lease or reservation request, before the next one looks; a raylet serves requests for the
same resources in arrival order. One that fits nowhere waits again without holding up the
rest.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Iterable


class Turns:
    def __init__(self, spawn: Callable[[Any, str], "asyncio.Task[Any]"], order: Callable[[], Iterable[bytes]],
                 period_s: float, name: str) -> None:
        #: ``spawn(coro, name)``: a task the owner stops with itself.
        self._spawn = spawn
        self._order = order
        self.period_s = period_s
        self._name = name
        self._waiting: dict[bytes, asyncio.Future[None]] = {}
        self._poller: asyncio.Task[Any] | None = None

    async def wait(self, key: bytes) -> None:
        """Until the next node change or tick of the shared timer, in ``key``'s turn."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = fut
        if self._poller is None or self._poller.done():
            self._poller = self._spawn(self._poll(), self._name)
        try:
            await fut
        finally:
            if self._waiting.get(key) is fut:
                del self._waiting[key]

    def wake(self) -> None:
        """Resolve every waiter, in ``order`` (keys it does not list last)."""
        waiting, self._waiting = self._waiting, {}
        if not waiting:
            return
        for key in self._order():
            fut = waiting.pop(key, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
            if not waiting:
                return
        for fut in waiting.values():  # (gone from the table meanwhile)
            if not fut.done():
                fut.set_result(None)

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.period_s)
            self.wake()
