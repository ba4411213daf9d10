"""Object files a dead client left unsealed under their final names.

A process writes a put or a task's return into one of its reserved store files, moves
that file to the object's name, then sends the seal one way (``object_store/client.py``).
Killed between the move and the seal, it leaves a complete file the raylet never hears
of: when the client goes, the store state unlinks its reserved files under their slot
names only. So the state asks for a sweep (``SweepMoved``) when it drops a dead
client's reservations; this class then:

1. checks, in the raylet's unlink thread and before that thread unlinks the slots'
   files, whether some slot has none of its names left (moved; or never made, which
   costs only a look at the directory);
2. lists the store directory's object files (name and inode, from the directory
   entries: no ``stat``) and keeps those the store state does not know;
3. ``MOVED_SWEEP_S`` later lists them again: a file still unknown and still the same
   inode was not a live writer's move whose seal was on its way (a seal follows its move
   within milliseconds); the state unlinks it (``MovedFilesFound``).

Sweeps run one at a time; a client that goes during one gets another after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
from typing import Any, Callable

from lumos._private.ids import ObjectID
from lumos._private.object_store import store_state as st

logger = logging.getLogger(__name__)

def any_slot_moved(slots: list[tuple[str, ...]]) -> bool:
    """Whether one of these slots has none of its file names left."""
    return any(not any(os.path.lexists(name) for name in names) for names in slots)


def object_files(directory: str) -> dict[str, int]:
    """Name -> inode of the files in ``directory`` named as objects."""
    found: dict[str, int] = {}
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if len(entry.name) == st.OBJECT_NAME_LEN:
                    found[entry.name] = entry.inode()
    except OSError as e:  # the session ends and takes the store directory with it
        logger.debug("listing the store %s: %s", directory, e)
    return found


class MovedSweep:
    def __init__(self, store: st.ObjectStoreState, executor: concurrent.futures.Executor,
                 report: Callable[[list[ObjectID]], None]) -> None:
        self._store = store
        #: The raylet's unlink thread: one thread, so a check submitted before the
        #: slots' unlinks runs before them.
        self._executor = executor
        self._report = report
        self._running = False
        self._again = False

    def check(self, action: st.SweepMoved) -> concurrent.futures.Future[bool] | None:
        """Submit the check of a dead client's slots; None when the raylet is stopping."""
        try:
            return self._executor.submit(any_slot_moved, action.slots)
        except RuntimeError:  # stopping: the session's end removes the store directory
            return None

    async def run(self, check: concurrent.futures.Future[bool]) -> None:
        if not await asyncio.wrap_future(check):
            return
        if self._running:
            self._again = True
            return
        self._running = True
        try:
            again = True
            while again:
                self._again = False
                await self._sweep()
                again = self._again
        finally:
            self._running = False

    async def _sweep(self) -> None:
        first = self._unknown(await self._list())
        if not first:
            return
        await asyncio.sleep(st.MOVED_SWEEP_S)
        second = self._unknown(await self._list())
        found = [oid for oid, ino in second.items() if first.get(oid) == ino]
        if found:
            logger.info("unlinking %d object file(s) a process that died left unsealed", len(found))
            self._report(found)

    async def _list(self) -> dict[str, int]:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, object_files, self._store.directory)
        except RuntimeError:  # the raylet stops (its unlink thread is gone)
            return {}

    def _unknown(self, files: dict[str, int]) -> dict[Any, int]:
        """Object id -> inode of those ``files`` the store state does not know."""
        objects = self._store.objects
        unknown: dict[Any, int] = {}
        for name, ino in files.items():
            try:
                oid = bytes.fromhex(name)
            except ValueError:
                continue
            if oid not in objects:
                unknown[oid] = ino
        return unknown
