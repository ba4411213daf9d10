"""The object API of one process: ``put``, ``get``, ``wait``, futures, and reading values.

User threads call these; they read the object table (``references.ObjectTable``) under
its lock without a hop to the io thread (a ready value is returned with no syscall) and
wait on a per-call ``Waiter`` lock in short slices, so Ctrl-C works. What needs the
network (asking a borrowed object's owner, pulls from other nodes, rebuilds) is handed
to the io thread. The io-thread half answers other processes' ``GetObjectStatus``.

```
 put(v):  serialize ─► small: entry READY, value inline
                     └► large: a reserved slot? write it, link it ─► SealObject(slot) (one way)
                               else CreateObject ─► StoreClient.write (this thread) ─► SealObject
 get(refs): entries ready? ─► read inline / mmap the store file (pull from its node first)
            else Waiter on the entries ◄── io thread completes them (TaskReply, _fetch)
            lost with its node ─► owned: rerun its lineage;  borrowed: ask the owner to
```
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import logging
import os
import threading
import time
from typing import Any, Callable

from lumos import exceptions as exc
from lumos._private import interrupts
from lumos._private import serialization as ser
from lumos._private.core_worker.io_loop import Claim
from lumos._private.core_worker.references import FAILED, PENDING, READY, Waiter, holds_error
from lumos._private.core_worker.tasks import DONE, DRIVER, PUSHED, QUEUED, WAITING_ARGS, WORKER
from lumos._private.ids import NodeID, ObjectID, WorkerID, is_put_object, put_object_id, short, task_id_of
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)

#: ``ObjectStatus.status`` values (the owner's answer to ``GetObjectStatus``).
STATUS_PENDING, STATUS_READY, STATUS_FREED, STATUS_LOST = m.ObjectState


#: Store slots a process keeps reserved per size it writes (``ReserveSlots``), for
#: values up to ``RESERVE_MAX_BYTES`` (larger ones are rarer and would hold more memory):
#: ``RESERVE_AHEAD_BYTES`` worth, between ``RESERVE_AHEAD`` and ``RESERVE_AHEAD_MAX``
#: slots; topped up when half are used, so one request serves several puts. With 2
#: ahead, a third of a burst of 1 MiB by-value task arguments still waited for a
#: create; with 4, one in eight, and a request went out every other put.
RESERVE_AHEAD = 4
RESERVE_AHEAD_MAX = 16
RESERVE_AHEAD_BYTES = 16 * 1024 * 1024
RESERVE_MAX_BYTES = 16 * 1024 * 1024
#: After the raylet had no slot to spare, a size is not asked for again for this long.
RESERVE_RETRY_S = 1.0


def reserve_ahead(size: int) -> int:
    """Slots of ``size`` bytes a process keeps reserved."""
    return max(RESERVE_AHEAD, min(RESERVE_AHEAD_MAX, RESERVE_AHEAD_BYTES // max(1, size)))


def _store_os_error(e: OSError, size: int) -> BaseException:
    """A write into the store failed in the OS: a full ``/dev/shm`` is the usual cause."""
    if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EDQUOT):
        return exc.ObjectStoreFullError(
            f"no room in /dev/shm for an object of {size / (1024 * 1024):.1f} MiB ({e.strerror}): the "
            "object store's memory is larger than the free shared memory of this machine; free "
            "shared memory, or start the cluster with a smaller object_store_memory")
    return e


def error_blob(error: BaseException) -> bytes:
    """Serialize an error as a value whose ``get`` raises it."""
    try:
        return ser.serialize(error, ser.KIND_ERROR).to_bytes()
    except ser.SerializationError:
        fallback = exc.LumosSystemError(f"{type(error).__name__}: {error}")
        return ser.serialize(fallback, ser.KIND_ERROR).to_bytes()


#: Ray's ``task_status`` of a pending task's return, from the owner's state of the task.
_OWNER_TASK_STATUS = {WAITING_ARGS: "PENDING_ARGS_AVAIL", QUEUED: "PENDING_NODE_ASSIGNMENT",
                      PUSHED: "SUBMITTED_TO_WORKER"}


class ObjectsMixin:
    """``CoreWorker``'s put/get/wait/futures (user threads) and object-status handlers (io thread)."""

    objects: Any
    config: Any
    io: Any
    store: Any
    raylet: Any
    node_id: NodeID
    worker_id: WorkerID
    address: m.Address

    #: Pin changes not sent yet: object id -> (first, last) ``pinned`` since the last
    #: send (``_flush_pins``); guarded by ``_pin_lock``.
    _pin_changes: dict[bytes, tuple[bool, bool]] | None = None
    _pin_lock: threading.Lock | None = None
    #: A ``_flush_pins`` is posted to the io thread.
    _pin_flush_posted = False
    #: ``get`` of several values in progress (pins are sent once at its end).
    _pin_batches = 0

    def _store_pin_changed(self, object_id: ObjectID, pinned: bool) -> None:
        """Tell the raylet whether this process views ``object_id`` (viewed objects are
        never spilled). Any thread, also garbage collection at exit.

        A lone first view is pinned at once. Pins during a ``get`` of several values go
        together at its end. Unpins wait for the next message that goes anyway: a free
        (``_flush_frees`` sends them first, in the same write: a sync loop's returned
        value is unpinned and freed in one wake-up of the io thread and of the raylet,
        not two), a pin, or the flush loop's next interval (``wake_flush``), whichever
        comes first; dropping a list of 1,000 arrays sends one message, and a pin and
        unpin of the same object in between send none (the raylet keeps whether a
        process views an object, not how often). An unpin only makes an object
        spillable, so its lateness is bounded by that interval."""
        if self._closed or self.loop is None or self.loop.is_closed():
            return
        if self._pin_lock is None:
            self._pin_lock = threading.Lock()
        with self._pin_lock:
            pending = self._pin_changes
            if pinned and not pending and not self._pin_batches:
                direct = True
            else:
                direct = False
                if pending is None:
                    pending = self._pin_changes = {}
                first = pending.get(object_id)
                pending[object_id] = (pinned if first is None else first[0], pinned)
                post = pinned and not self._pin_batches and not self._pin_flush_posted
                if post:
                    self._pin_flush_posted = True
        try:
            if direct:
                self._to_raylet(m.PinObjects([object_id], True))
            elif post:
                self._post(self._flush_pins)
            elif not pinned:
                self.wake_flush()  # the flush loop sends it within an interval at most
        except exc.LumosSystemError:
            pass  # shutting down: the raylet forgets this process's pins when it goes

    def _flush_pins(self) -> None:
        """Send the pin changes gathered so far (any thread). On the io thread they go on
        the raylet link at once: posted, they would leave after a free the same turn had
        already queued (the flush loop releases refs, then flushes pins), and the raylet,
        seeing the object still viewed at its free, would unlink its file, not pool it."""
        try:
            send = self._notify_raylet if self.io.in_io_thread() else self._to_raylet
            for msg in self._pin_messages():
                send(msg)
        except exc.LumosSystemError:
            pass

    def _pin_messages(self) -> list[m.PinObjects]:
        """Take the pin changes gathered so far, as the messages that say them."""
        lock = self._pin_lock
        if lock is None or not self._pin_changes:
            return []
        with lock:
            pending, self._pin_changes = self._pin_changes, None
            self._pin_flush_posted = False
        if not pending:
            return []
        ups = [oid for oid, (first, last) in pending.items() if last and first]
        downs = [oid for oid, (first, last) in pending.items() if not last and not first]
        # first != last: back where it was before these changes: nothing to say.
        return ([m.PinObjects(ups, True)] if ups else []) + ([m.PinObjects(downs, False)] if downs else [])

    def _free_after_views(self, object_id: ObjectID) -> None:
        """An object we freed while viewing it lost its last view here (any thread, GC
        included): free it in the store now, its slot reusable if nobody else views it."""
        if self._closed or self.loop is None or self.loop.is_closed():
            return
        try:
            self._post(self._send_releases, [object_id], [True], {})
        except exc.LumosSystemError:
            pass  # shutting down: the raylet frees what this process owned when it goes

    def _restore_spilled(self, object_id: ObjectID) -> str | None:
        """The object's store file is missing: ask the raylet to restore it (user threads).
        Returns None (not on this node), "" (back in the store) or a spill file to map."""
        if self.raylet is None or self.io.in_io_thread():
            return None
        try:
            answer = self.call_raylet(m.RestoreSpilled(object_id), 3600.0)  # the raylet bounds it by size
        except (RemoteError, TimeoutError, exc.LumosSystemError) as e:
            logger.warning("restoring spilled object %s failed: %s", short(object_id), e)
            return None
        return answer if isinstance(answer, str) else None

    def put(self, value: Any, *, _owner: m.Address | None = None, _kind: int = ser.KIND_VALUE) -> ObjectRef:
        """``_kind=KIND_ERROR``: ``get`` raises ``value`` (a dynamic generator's error)."""
        if isinstance(value, ObjectRef):
            raise TypeError("lumos.put() of an ObjectRef is not allowed; pass the ref itself instead")
        self.drain_refs()
        if isinstance(value, exc.TaskError):
            _kind = ser.KIND_ERROR  # as Ray: a task's error, put, raises again when got
        ref = self._put_serialized(ser.serialize(value, _kind))
        if self._top_ups:
            self.top_up_reserved()
        return ref

    def _put_serialized(self, sv: ser.SerializedValue, lend: bool = False) -> ObjectRef:
        """``put`` of a value serialized already (a by-value argument promoted to a ref).
        ``lend``: a task's by-value argument, lent in a reserved slot when one fits
        (``_write_to_store``)."""
        self._put_counter += 1
        oid = put_object_id(self.current_task_id, self._put_counter)
        nested = [(r._id, r._owner or self.address) for r in sv.nested_refs]
        held = interrupts.hold()  # (the stop button: the put is made whole, or not begun)
        try:
            if sv.total_size < self.config.max_inline_object_bytes:
                data = sv.to_bytes()
                with self.objects.lock:
                    e = self.objects.add_owned(oid)
                    e.state = READY
                    e.data = data
                    e.size = len(data)
            else:
                lent = self._write_to_store(oid, sv, keep_mapping=True, lend=lend)
                with self.objects.lock:
                    e = self.objects.add_owned(oid)
                    e.state = READY
                    e.node_id = self.node_id
                    e.size = sv.total_size
                    e.lent = lent
            if nested:
                self.objects.add_contained(nested, registered=True)
                with self.objects.lock:
                    e.nested = nested
                    for noid, _ in nested:
                        ne = self.objects.entries.get(noid)
                        if ne is not None:
                            ne.shared = True
            return ObjectRef(oid, self.address, True)
        finally:
            if held:
                interrupts.release()  # (a stop pressed meanwhile raises here: the ref, dropped, frees it)

    def _write_to_store(self, oid: ObjectID, sv: ser.SerializedValue, keep_mapping: bool,
                        owner: bytes = b"", lend: bool = False) -> int:
        """Create the object in this node's store and copy the value in (user thread).
        ``owner``: the owning process's worker id when it is not this one.

        A slot reserved ahead (``ReserveSlots``) that fits is written, linked under the
        object's name and sealed one way: no wait on the raylet. Otherwise (none fits,
        or the raylet took it back) the object is created with a round trip.

        ``lend``: a task's by-value argument. Written into a reserved slot, it stays in
        that slot's file, lent to the task (``StoreClient.write_lent``): no seal, and once
        the task is done no free (``_release`` reclaims the slot for the next one); it
        becomes an object only if it must (``publish_lent``). Returns the slot, or -1
        when the value was stored as an object."""
        size = sv.total_size
        if size <= RESERVE_MAX_BYTES:
            mapping = self.store.take_reserved(size, lend)
            if mapping is not None and lend:
                try:
                    lent = self.store.write_lent(oid, mapping, size, sv.write_into, sv.pieces)
                except OSError as e:
                    raise _store_os_error(e, size) from None
                if lent:
                    left = self.store.reservations(size)
                    if left == 0:
                        self._post(self._reserve_slots, size)
                    elif left <= reserve_ahead(size) // 2 and size not in self._reserving:
                        self._top_ups.add(size)  # asked for after the push (``top_up_reserved``)
                    return mapping.slot
                mapping = None  # taken back before it was lent: written the usual way
            if mapping is not None:
                try:
                    done = self.store.write_reserved(oid, mapping, size, sv.write_into, keep_mapping, sv.pieces)
                except OSError as e:
                    raise _store_os_error(e, size) from None
                if done:
                    seal = m.SealObject(oid, size, True, mapping.slot, mapping.size, owner)
                    left = self.store.reservations(size)
                    if left == 0:
                        self._post(self._sealed_reserved, seal)  # and top up: a wake-up anyway
                    else:
                        self._to_raylet(seal)
                        if left <= reserve_ahead(size) // 2 and size not in self._reserving:
                            # Asked for once the write this value is for has gone (the
                            # reply, the push, the put: ``top_up_reserved``): posted now,
                            # it woke the io thread, which then sent that write too.
                            self._top_ups.add(size)
                    return -1
            elif self.store.reservations(size) < reserve_ahead(size):
                self._post(self._reserve_slots, size)
        claim = Claim(lambda _grant: self._abandon_created(oid))
        try:
            with interrupts.Window():  # (it may wait for room: the stop button works here)
                slot, path, final_path, file_size, reused = self.call_raylet(
                    m.CreateObject(oid, sv.total_size, self.worker_id, owner),
                    self.config.object_store_full_timeout_s + self.config.rpc_timeout_s, claim)
        except BaseException as e:
            if claim.left() or not isinstance(e, RemoteError):
                raise  # (the stop button: a grant, now or later, is given back)
            if e.type_name == "_StoreFull":
                raise exc.ObjectStoreFullError(e.text) from None
            if e.type_name == "_OutOfDisk":
                raise exc.OutOfDiskError(e.text) from None
            if e.type_name == "_ObjectExists":
                return -1  # a task run again where a copy of its result was pulled earlier
            raise
        try:
            self.store.write(oid, path, final_path, slot, file_size, reused, sv.total_size,
                             sv.write_into, keep_mapping, sv.pieces)
        except BaseException as e:
            self._post(self._send_releases, [oid], [False], {})
            if isinstance(e, OSError):
                raise _store_os_error(e, sv.total_size) from None
            raise
        self._to_raylet(m.SealObject(oid, sv.total_size))
        return -1

    def _abandon_created(self, oid: ObjectID) -> None:
        """Any thread: the store created ``oid`` for a put whose caller was interrupted
        while it waited (the stop button): its slot is given back."""
        try:
            self._post(self._send_releases, [oid], [False], {})
        except exc.LumosSystemError:
            pass  # shut down meanwhile: the store goes with the session

    def publish_lent(self, object_id: ObjectID) -> None:
        """A lent argument must become an object the raylet serves (its task goes to a
        worker on another node, or someone asks about it by id): linked under its name
        and sealed as a reserved put (any thread; nothing when it is not lent)."""
        with self.objects.lock:
            e = self.objects.entries.get(object_id)
            if e is None or e.lent < 0:
                return
            seal = self._publish_lent(object_id, e)
        if seal is not None:
            if self.io.in_io_thread():
                self._notify_raylet(seal)
            else:
                self._to_raylet(seal)

    def _publish_lent(self, object_id: ObjectID, e: Any) -> m.SealObject | None:
        """The seal that makes lent entry ``e`` an object (its file renamed now)."""
        e.lent = -1
        got = self.store.publish(object_id)
        if got is None:
            return None
        slot, file_size = got
        return m.SealObject(object_id, e.size, True, slot, file_size, b"")

    def keep_lent_local(self, spec: m.TaskSpec, node_id: NodeID | None) -> None:
        """``spec`` is about to be pushed to a worker on ``node_id``: lent arguments are
        for workers on this node only; for another, they become objects first."""
        if node_id == self.node_id:
            return
        for dep in spec.deps:
            if dep.slot >= 0:
                dep.slot = -1
                self.publish_lent(dep.object_id)

    def _to_raylet(self, msg: Any) -> None:
        """Any thread: a one-way message to the raylet, straight to its socket when
        nothing posted waits to leave before it (no wake-up of the io thread: a put's
        seal, then its task's push, wake it once, and a return's seal, then the reply,
        not at all); else through the io thread, after what was posted."""
        raylet = self.raylet
        if raylet is not None and self.io.idle() and raylet.write_now(msg):
            return
        self._post(self._notify_raylet, msg)

    def top_up_reserved(self) -> None:
        """Any thread, after the write a value just stored was for: ask for the slots of
        the sizes that ran low (one post for all; a size lost to a race here is asked for
        again by its next write)."""
        sizes = list(self._top_ups)
        self._top_ups.clear()
        if sizes:
            self._post(self._top_up_now, sizes)

    def _top_up_now(self, sizes: list[int]) -> None:
        for size in sizes:
            if self.store.reservations(size) <= reserve_ahead(size) // 2:
                self._reserve_slots(size)

    def _sealed_reserved(self, msg: m.SealObject) -> None:
        """io thread: tell the raylet, and reserve the next slot of that size."""
        self._notify_raylet(msg)
        if self.store.reservations(msg.size_bytes) <= reserve_ahead(msg.size_bytes) // 2:
            self._reserve_slots(msg.size_bytes)

    def _reserve_slots(self, size: int) -> None:
        """io thread: ask the raylet for slots of ``size`` bytes ahead of the next puts."""
        if self.raylet is None or size in self._reserving:
            return
        self._reserving.add(size)
        self.io.spawn(self._reserve(size), "store.reserve")

    async def _reserve(self, size: int) -> None:
        try:
            want = reserve_ahead(size) - self.store.reservations(size)
            if want > 0 and self.raylet is not None:
                grants = await self.raylet.call(m.ReserveSlots(size, want), self.config.rpc_timeout_s)
                if not grants:
                    # None to spare (the store is busy): ask again for this size in a
                    # while, not on every put.
                    asyncio.get_running_loop().call_later(RESERVE_RETRY_S, self._reserving.discard, size)
                    return
                self.store.map_reserved_soon(grants)
        except (ConnectionLost, RemoteError, TimeoutError, OSError) as e:
            logger.debug("reserving store slots of %d bytes failed: %s", size, e)
        self._reserving.discard(size)

    def _notify_raylet(self, msg: Any) -> None:
        if self.raylet is not None:
            self.raylet.notify(msg)

    def get(self, refs: list[ObjectRef], timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        self.drain_refs()
        entries = self.objects.entries
        missing: list[ObjectRef] = []
        for ref in refs:
            e = entries.get(ref._id)
            if e is None or e.state == PENDING:
                missing.append(ref)
        if missing:
            # As in Ray, a get of several raises the first error to happen without waiting
            # for the rest (one failed already: at once).
            failed: ObjectRef | None = None
            if len(missing) < len(refs):
                for ref in refs:
                    e = entries.get(ref._id)
                    if e is not None and e.state != PENDING and holds_error(e):
                        failed = ref
                        break
            if failed is None:
                fail_fast = len(refs) > 1
                failed_id = self._wait_for(missing, len({r._id for r in missing}), timeout, for_get=True,
                                           fail_fast=fail_fast)
                if fail_fast and failed_id is not None:
                    failed = next(r for r in missing if r._id == failed_id)
            if failed is not None:
                self._value_of(failed, deadline)  # raises its error
        if len(refs) > 1:
            self._pull_remote_together(refs)
        if len(refs) == 1:
            return [self._value_of(refs[0], deadline)]
        if self._pin_lock is None:
            self._pin_lock = threading.Lock()
        with self._pin_lock:
            self._pin_batches += 1
        try:
            return [self._value_of(ref, deadline) for ref in refs]
        finally:
            with self._pin_lock:
                self._pin_batches -= 1
                flush = not self._pin_batches and bool(self._pin_changes) and not self._pin_flush_posted
            if flush:
                self._flush_pins()

    def _pull_remote_together(self, refs: list[ObjectRef]) -> None:
        """Copy the objects of ``refs`` that live on other nodes here, all pulls at once
        (then each read finds its copy local; a failed pull is reported by that read)."""
        remote = self._stored_elsewhere(refs)
        if len(remote) >= 2 and self.raylet is not None:
            self._pull_here(remote, time.monotonic() + 3600.0)

    def _stored_elsewhere(self, refs: list[ObjectRef]) -> dict[bytes, bytes]:
        """Of ``refs``, those whose ready value is in another node's store: id -> that node."""
        entries = self.objects.entries
        remote: dict[bytes, bytes] = {}
        for ref in refs:
            e = entries.get(ref._id)
            if e is not None and e.state == READY and e.data is None and e.node_id is not None \
                    and e.node_id != self.node_id:
                remote[ref._id] = e.node_id
        return remote

    def _pull_here(self, remote: dict[bytes, bytes], deadline: float | None) -> dict[bytes, bool] | None:
        """Copy these values (id -> the node holding it) into this node's store, all pulls at
        once, until ``deadline``; their owners hear of the copies (``note_pulled``). Returns
        id -> whether it was copied, for the pulls that ended by then (the others go on in
        the raylet); None when lumos is shut down."""
        raylet = self.raylet

        async def pull(oid: bytes, node: bytes) -> bool:
            try:
                await raylet.call(m.PullObject(oid, node, 0, self._owner_id_of(oid)))
                return True
            except Exception:  # (the read that follows reports why)
                return False

        async def pull_all() -> dict[bytes, bool]:
            tasks = {oid: self._spawn(pull(oid, node), "pull-here") for oid, node in remote.items()}
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            await asyncio.wait(tasks.values(), timeout=left)
            return {oid: t.result() for oid, t in tasks.items() if t.done()}

        try:
            ended: dict[bytes, bool] = self.run_sync(pull_all(), None)
        except exc.LumosSystemError:
            return None
        entries = self.objects.entries
        self.note_pulled([(oid, None if e.owned else e.owner) for oid, ok in ended.items()
                          if ok and (e := entries.get(oid)) is not None])
        return ended

    def _wait_for(self, refs: list[ObjectRef], num: int, timeout: float | None,
                  for_get: bool = False, fail_fast: bool = False) -> Any:
        """Block until ``num`` of ``refs`` are ready. Returns ids in completion order
        (``wait`` puts them back in the order given).

        ``for_get``: raise ``GetTimeoutError`` at the deadline (``wait`` just returns).
        ``fail_fast`` (a get): stop at the first of them that failed and return its id
        (None when none failed).
        """
        if for_get and self._calls_to_self:
            self._refuse_waiting_for_own_calls(refs)
        waiter = Waiter(num, fail_fast)
        to_fetch: list[tuple[bytes, m.Address]] = []
        seen: set[bytes] = set()
        with self.objects.lock:
            for ref in refs:
                oid = ref._id
                if oid in seen:
                    continue
                seen.add(oid)
                e = self.objects.entries.get(oid)
                if e is None:
                    waiter.hit(oid)  # unknown here: _value_of explains
                elif e.state != PENDING:
                    waiter.hit(oid, holds_error(e))
                else:
                    if e.waiters is None:
                        e.waiters = []
                    e.waiters.append(waiter)
                    if not e.owned and not e.fetching and e.owner is not None:
                        e.fetching = True
                        to_fetch.append((oid, e.owner))
                if waiter.remaining <= 0 or (fail_fast and waiter.failed is not None):
                    break
        if waiter.remaining <= 0 or (fail_fast and waiter.failed is not None):
            return waiter.failed if fail_fast else waiter.order
        for oid, owner in to_fetch:
            self._post(self._start_fetch, oid, owner)
        deadline = None if timeout is None else time.monotonic() + timeout
        self._set_blocked(True)
        try:
            while True:
                slice_s = self.config.wait_slice_s
                if deadline is not None:
                    slice_s = min(slice_s, deadline - time.monotonic())
                    if slice_s <= 0:
                        break
                if waiter.lock.acquire(timeout=slice_s):
                    break
        except KeyboardInterrupt:
            self._cancel_refs_on_interrupt(refs)
            raise
        finally:
            self._set_blocked(False)
            if waiter.remaining > 0:
                with self.objects.lock:
                    for ref in refs:
                        e = self.objects.entries.get(ref._id)
                        if e is not None and e.waiters and waiter in e.waiters:
                            e.waiters.remove(waiter)
        if fail_fast and waiter.failed is not None:
            return waiter.failed
        if waiter.remaining > 0 and for_get:
            raise exc.GetTimeoutError(
                f"get timed out after {timeout}s: {waiter.remaining} of {num} objects not ready")
        return None if fail_fast else waiter.order

    def _refuse_waiting_for_own_calls(self, refs: list[ObjectRef]) -> None:
        """A call of a one-at-a-time actor that waits in get() for another call to the same
        actor waits for ever: that call runs only once this one has returned (Ray hangs
        there). Raise instead, saying so."""
        executor = self.executor
        actor = executor.actor if executor is not None else None
        if actor is None or actor.concurrent or threading.get_ident() != executor._main_ident:
            return
        calls = self._calls_to_self
        entries = self.objects.entries
        for ref in refs:
            name = calls.get(task_id_of(ref._id))
            e = entries.get(ref._id) if name is not None else None
            if e is not None and e.state == PENDING:
                raise RuntimeError(
                    f"this call of actor {actor.class_name} waits in get() for {name}(), a call to the "
                    "same actor, which runs only after this call returns: it would wait for ever. "
                    "Return the ref instead of its value, call the method directly (self.method()), "
                    "or give the actor max_concurrency > 1 (or async methods)")

    def _set_blocked(self, blocked: bool) -> None:
        executor = self.executor
        if self.mode != WORKER or executor is None or not executor.running_task():
            return
        if blocked:
            self._blocked_depth += 1
            if self._blocked_depth == 1:
                self._post(self._tell_blocked, m.WorkerBlocked(self.worker_id), executor.task_owner_conn())
                executor.requeue_waiting()
        else:
            self._blocked_depth -= 1
            if self._blocked_depth == 0:
                self._post(self._tell_blocked, m.WorkerUnblocked(self.worker_id), executor.task_owner_conn())

    def _tell_blocked(self, msg: m.WorkerBlocked | m.WorkerUnblocked, owner: Connection | None) -> None:
        """io thread: the running task waits in get() or wait() (or no longer does). The
        raylet lends its CPU out meanwhile; the task's owner, when it holds this worker's
        lease, stops counting it against ``max_leases_per_scheduling_key`` (the tasks it
        waits for may need workers of their own)."""
        self._notify_raylet(msg)
        if owner is not None and not owner.is_closed:
            owner.notify(msg)

    def _cancel_refs_on_interrupt(self, refs: list[ObjectRef]) -> None:
        executor = self.executor
        if executor is not None and not executor.interrupt_cancels_awaited():
            return
        for ref in refs:
            e = self.objects.entries.get(ref._id)
            if e is not None and e.owned and e.state == PENDING:
                try:
                    self.cancel(ref, force=False, recursive=True)
                except Exception:
                    logger.exception("cancel on Ctrl-C failed")

    def wait(self, refs: list[ObjectRef], num_returns: int, timeout: float | None,
             fetch_local: bool) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """``ray.wait``. With ``fetch_local`` (Ray's default), a ready value stored on another
        node counts as ready once it is copied into this node's store (``_fetch_ready``)."""
        if not fetch_local or self.raylet is None:
            return self._wait(refs, num_returns, timeout)
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        ready, not_ready = self._wait(refs, num_returns, timeout)
        if not self.objects.remote_values:  # (looked at once they are ready)
            return ready, not_ready
        return self._fetch_ready(refs, ready, not_ready, deadline)

    def _fetch_ready(self, refs: list[ObjectRef], ready: list[ObjectRef], not_ready: list[ObjectRef],
                     deadline: float | None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        """Copy the values among ``ready`` that are stored on other nodes into this node's
        store, all pulls at once, by ``deadline``; one whose copy is still under way then is
        not ready yet (it goes on in the raylet). A pull that failed leaves its ref ready:
        ``get`` says why, or has the value rebuilt."""
        remote = {oid: node for oid, node in self._stored_elsewhere(ready).items()
                  if not self.store.contains_local(oid)}
        if not remote:
            return ready, not_ready
        ended = self._pull_here(remote, deadline)
        if ended is None or len(ended) == len(remote):
            return ready, not_ready
        late = remote.keys() - ended.keys()
        late.update(r._id for r in not_ready)
        return [r for r in ready if r._id not in late], [r for r in refs if r._id in late]

    def _wait(self, refs: list[ObjectRef], num_returns: int,
              timeout: float | None) -> tuple[list[ObjectRef], list[ObjectRef]]:
        if self.objects.decrements:
            self.drain_refs()
        # Fast path: enough of them are done already (one pass, no waiter).
        get = self.objects.entries.get
        done: list[ObjectRef] = []
        rest: list[ObjectRef] = []
        with self.objects.lock:
            if num_returns == len(refs):
                for r in refs:
                    e = get(r._id)
                    if e is not None and e.state == PENDING:
                        break
                else:
                    return list(refs), []
            for r in refs:
                e = get(r._id)
                if (e is None or e.state != PENDING) and len(done) < num_returns:
                    done.append(r)
                else:
                    rest.append(r)
        if len(done) >= num_returns or timeout == 0:
            return done, rest
        by_id: dict[bytes, ObjectRef] = {}
        for ref in refs:
            by_id.setdefault(ref._id, ref)
        order = self._wait_for(refs, num_returns, timeout)
        ready_ids = order[:num_returns]
        ready_set = set(ready_ids)
        # Several objects may have become ready at once: add any others already done.
        if len(ready_ids) < num_returns:
            with self.objects.lock:
                for oid in by_id:
                    if oid not in ready_set:
                        e = self.objects.entries.get(oid)
                        if e is not None and e.state != PENDING and len(ready_ids) < num_returns:
                            ready_ids.append(oid)
                            ready_set.add(oid)
        # As in Ray, both lists keep the order the refs were given in.
        ready = [r for r in refs if r._id in ready_set]
        not_ready = [r for r in refs if r._id not in ready_set]
        return ready, not_ready

    def _value_of(self, ref: ObjectRef, deadline: float | None = None) -> Any:
        e = self.objects.entries.get(ref._id)
        if e is None:
            from lumos._private import worker_context
            raise exc.ObjectFreedError(ref._id.hex(), worker_context.earlier_session(ref._owner) or (
                "no reference to it is held in this process (was the ObjectRef created by hand?)"))
        data = e.data
        if data is not None:
            kind, value = ser.deserialize(data)
        elif (node := e.node_id) is not None:
            lost_detail = None
            try:
                kind, value = self._read_from_store(ref._id, node)
            except exc.ObjectLostError as lost:
                if e.data is not None or (not e.owned and e.owner is None):
                    raise
                lost_detail = lost.detail
            if lost_detail is not None:
                # Outside the handler: the caught error's traceback would keep this frame,
                # and ``ref`` with it, alive in a cycle.
                if e.owned:
                    kind, value = self._rebuild_and_read(ref, node, lost_detail, deadline)
                else:
                    kind, value = self._refetch_and_read(ref, e.owner, node, lost_detail, deadline)
        else:
            raise exc.ObjectLostError(ref._id.hex(), "its value was never recorded")
        if kind == ser.KIND_ERROR:
            e.seen = True  # (handled: not reported as unhandled when it goes)
            if isinstance(value, exc.TaskError):
                raise value.as_instanceof_cause()
            raise value
        return value

    def _read_from_store(self, oid: ObjectID, node_id: NodeID) -> tuple[int, Any]:
        view = self.store.view(oid, restore=node_id == self.node_id, spare=True)
        if view is None and node_id != self.node_id:
            self.pull_to_local(oid, node_id)
            view = self.store.view(oid, spare=True)
            e = self.objects.entries.get(oid)
            if view is not None and e is not None:
                self.note_pulled([(oid, None if e.owned else e.owner)])
        if view is None:
            if node_id != self.node_id:
                raise exc.ObjectLostError(oid.hex(), f"it lives on node {short(node_id)}, and this "
                                          "process cannot read it")
            raise exc.ObjectLostError(oid.hex(), "its file is gone from this node's object store")
        return ser.deserialize(view)

    def _rebuild_and_read(self, ref: ObjectRef, node_id: NodeID, detail: str,
                          deadline: float | None) -> tuple[int, Any]:
        """An object this process owns was lost with its node: run the task that made it
        again (lineage reconstruction), wait for the new value and read it (user thread)."""
        oid = ref._id

        def rebuild(node: bytes, detail: str) -> tuple[bytes | None, bytes | None] | None:
            async def run() -> str | None:
                return self._reconstruct(oid, node)

            why = self.run_sync(run(), self.config.rpc_timeout_s)
            if why is not None:
                # A task's value whose task cannot run again: Ray's ObjectReconstructionFailedError
                # (an ObjectLostError); a put() value has no lineage to fail.
                error = exc.ObjectLostError if is_put_object(oid) else exc.ObjectReconstructionFailedError
                raise error(oid.hex(), f"{detail}; it cannot be rebuilt: {why}")
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._wait_for([ref], 1, remaining, for_get=True)
            e = self.objects.entries.get(oid)
            if e is None or (e.data is None and e.node_id is None):
                return None
            return e.data, e.node_id

        return self._read_rebuilt(oid, node_id, detail, rebuild)

    def _refetch_and_read(self, ref: ObjectRef, owner: m.Address, node_id: NodeID, detail: str,
                          deadline: float | None) -> tuple[int, Any]:
        """A borrowed object's value was lost with its node: its owner rebuilds it from the
        lineage, then the new copy is read (user thread)."""
        oid = ref._id

        def rebuild(node: bytes, detail: str) -> tuple[bytes | None, bytes | None]:
            st = self.ask_owner_to_rebuild(oid, owner, node, deadline)
            self.objects.complete(oid, READY, st.data, st.node_id, st.size, None)
            return st.data, st.node_id

        return self._read_rebuilt(oid, node_id, detail, rebuild)

    def _read_rebuilt(self, oid: ObjectID, node_id: NodeID, detail: str,
                      rebuild: Callable[[bytes, str], tuple[bytes | None, bytes | None] | None]) -> tuple[int, Any]:
        """Read a value lost with node ``node_id`` once ``rebuild(node_id, detail)`` made it
        again: it gives the new ``(data, node_id)``, or None when no value was recorded. A
        copy lost again is rebuilt again, a few times at most (user thread)."""
        for _ in range(4):
            where = rebuild(node_id, detail)
            if where is None:
                break
            data, new_node = where
            if data is not None:
                return ser.deserialize(data)
            assert new_node is not None
            again = None
            try:
                return self._read_from_store(oid, new_node)
            except exc.ObjectLostError as lost:
                again = lost.detail  # kept outside the handler: its traceback would hold this frame
            detail, node_id = again, new_node
        raise exc.ObjectLostError(oid.hex(), f"{detail}; rebuilding it did not succeed")

    def ask_owner_to_rebuild(self, oid: ObjectID, owner: m.Address, lost_node: bytes,
                             deadline: float | None) -> m.ObjectStatus:
        """Tell ``oid``'s owner that its value cannot be read from ``lost_node``; the owner
        runs the task that made it again when it can. Returns the new location, or raises
        why there is none (user threads, blocking until the value is rebuilt)."""
        if owner.worker_id == self.worker_id:
            raise exc.ObjectLostError(oid.hex(), "its value is gone and this process owns it")

        async def ask() -> m.ObjectStatus:
            conn = await self._peer(owner)
            return await conn.call(m.GetObjectStatus(oid, True, self.address, lost_node))  # type: ignore[no-any-return]

        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._set_blocked(True)  # the rebuild may need this worker's CPU
        try:
            st: m.ObjectStatus = self.run_sync(ask(), remaining)
        except TimeoutError:
            raise exc.GetTimeoutError(f"get timed out while {short(oid)} was being rebuilt") from None
        except (OSError, ConnectionLost) as e:
            raise exc.OwnerDiedError(oid.hex(), f"its value was lost with node {short(lost_node)} and its "
                                     f"owner {short(owner.worker_id)} is unreachable: {e}") from None
        except RemoteError as e:
            raise exc.ObjectLostError(oid.hex(), str(e)) from None
        finally:
            self._set_blocked(False)
        if st.status == STATUS_READY and (st.data is not None or st.node_id is not None):
            return st
        if st.status == STATUS_FREED:
            raise exc.ObjectFreedError(oid.hex(), st.error or "its owner freed it")
        if st.status == STATUS_LOST and not is_put_object(oid):
            # The owner could not run its task again: Ray's class for it, as on the owner's side.
            raise exc.ObjectReconstructionFailedError(oid.hex(), st.error or "its owner could not rebuild it")
        raise exc.ObjectLostError(oid.hex(), st.error or "its owner lost it")

    def _owner_id_of(self, oid: ObjectID) -> bytes:
        """The worker id of ``oid``'s owner (a pulled copy is freed when that process dies)."""
        e = self.objects.entries.get(oid)
        if e is not None and not e.owned and e.owner is not None:
            return e.owner.worker_id
        return self.worker_id

    def pull_to_local(self, oid: ObjectID, node_id: NodeID, owner_id: bytes | None = None) -> None:
        """Have the local raylet copy ``oid`` from node ``node_id`` into this node's store (blocks).
        ``owner_id``: the object's owner, when this process has no entry for it."""
        try:
            self.call_raylet(m.PullObject(oid, node_id, 0, owner_id or self._owner_id_of(oid)), 3600.0)
        except (RemoteError, ConnectionLost, TimeoutError) as e:
            raise exc.ObjectLostError(oid.hex(), f"it lives on node {short(node_id)} and could not be "
                                      f"copied to this node: {e}") from None

    def _start_fetch(self, oid: ObjectID, owner: m.Address) -> None:
        self._spawn(self._fetch(oid, owner), "fetch")

    async def _fetch(self, oid: ObjectID, owner: m.Address) -> None:
        """Ask a borrowed object's owner for its value (long poll)."""
        try:
            conn = await self._peer(owner)
            st: m.ObjectStatus = await conn.call(m.GetObjectStatus(oid, True, self.address))
        except (OSError, ConnectionLost, TimeoutError) as e:
            self._complete_error(oid, exc.OwnerDiedError(oid.hex(), f"owner {short(owner.worker_id)} "
                                                         f"unreachable: {e}"))
            return
        except RemoteError as e:
            self._complete_error(oid, exc.ObjectLostError(oid.hex(), str(e)))
            return
        if st.status == STATUS_READY:
            freed = []
            e = self.objects.complete(oid, READY, st.data, st.node_id, st.size, None)
            if e is not None:
                e.fetching = False
            self._run_callbacks(oid, e)
            if freed:
                self._release(freed)
        elif st.status == STATUS_FREED:
            self._complete_error(oid, exc.ObjectFreedError(oid.hex(), st.error or "its owner freed it"))
        else:
            self._complete_error(oid, exc.ObjectLostError(oid.hex(), st.error or "its owner lost it"))

    def _complete_error(self, oid: ObjectID, error: BaseException) -> None:
        e = self.objects.complete(oid, FAILED, error_blob(error), None, 0, None)
        if e is not None:
            e.fetching = False
        self._run_callbacks(oid, e)

    def _handle_get_object_status(self, conn: Connection, msg: m.GetObjectStatus) -> Any:
        e = self.objects.entries.get(msg.object_id)
        if e is None or not e.owned:
            return m.ObjectStatus(STATUS_FREED, None, None, 0, "its owner no longer holds it")
        if e.lent >= 0:
            self.publish_lent(msg.object_id)  # asked for by id: it must be an object
        if msg.borrower is not None:
            e.shared = True
        lost = msg.lost_node
        if lost is not None and e.state == READY and e.data is None and e.node_id is not None \
                and (e.node_id == lost or e.node_id in self.dead_nodes):
            # (Not where the asker looked when it moved to a copy meanwhile; lost again
            # when that copy was gone, ``copies.py``.)
            lost = e.node_id
            why = self._reconstruct(msg.object_id, lost)
            if why is not None:
                return m.ObjectStatus(STATUS_LOST, None, None, 0, f"its value was lost with node {short(lost)} "
                                      f"and it cannot be rebuilt: {why}")
        if e.state != PENDING or not msg.wait:
            return self._status_of(e)
        fut: asyncio.Future[m.ObjectStatus] = asyncio.get_running_loop().create_future()

        def ready(entry: Any) -> None:
            if not fut.done():
                fut.set_result(self._status_of(entry) if entry is not None else
                               m.ObjectStatus(STATUS_FREED, None, None, 0, "freed while pending"))
        with self.objects.lock:
            if e.state != PENDING:
                return self._status_of(e)
            if e.callbacks is None:
                e.callbacks = []
            e.callbacks.append(ready)
        return fut

    @staticmethod
    def _status_of(e: Any) -> m.ObjectStatus:
        if e.state == PENDING:
            return m.ObjectStatus(STATUS_PENDING, None, None, 0)
        e.seen = True  # another process reads it: an error in it is that reader's to raise, not unhandled
        return m.ObjectStatus(STATUS_READY, e.data, e.node_id, e.size)

    def _run_callbacks(self, oid: ObjectID, e: Any) -> None:
        # Unlocked look first (nearly every reply: no callbacks): a thread adding one does so
        # under the lock after checking the entry is pending, which ``complete`` ended.
        if e is None or e.callbacks is None:
            return
        with self.objects.lock:
            cbs, e.callbacks = e.callbacks, None
        if cbs:
            for cb in cbs:
                try:
                    cb(e)
                except Exception:
                    logger.exception("object-ready callback failed")

    def future_of(self, ref: ObjectRef) -> concurrent.futures.Future[Any]:
        """A future resolved with the value when the object is ready (never blocks)."""
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.drain_refs()

        def resolve(_: Any = None) -> None:
            # The awaiting side may have cancelled the future (an asyncio task awaiting the
            # ref was cancelled), before this or while it runs: nothing to deliver then.
            if fut.cancelled():
                return
            try:
                value = self._value_of(ref)
            except BaseException as e:  # the future carries the error to the awaiting side
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    fut.set_exception(e)
                return
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                fut.set_result(value)

        def on_io() -> None:
            e = self.objects.entries.get(ref._id)
            if e is None or e.state != PENDING:
                threading.Thread(target=resolve, name="lumos-future", daemon=True).start() \
                    if (e is not None and e.node_id is not None and e.data is None) else resolve()
                return
            with self.objects.lock:
                if e.callbacks is None:
                    e.callbacks = []
                e.callbacks.append(lambda entry: resolve())
            if not e.owned and not e.fetching and e.owner is not None:
                e.fetching = True
                self._start_fetch(ref._id, e.owner)
        self._post(on_io)
        return fut

    def _creating_task_status(self, oid: ObjectID, owned: bool, state: str, failed: bool) -> tuple[str, int]:
        """Ray's ``task_status`` and ``attempt_number`` of an object's row: where the task
        that creates it stands, as its owner sees it, and its attempt (of a task this
        process owns, pending or kept as lineage). NIL for a ``put``, a borrowed object, or
        a returned value whose task this owner no longer knows."""
        if not owned or is_put_object(oid):
            return "NIL", 0
        tid = task_id_of(oid)
        task = self.tasks.get(tid) or self.lineage.get(tid)  # type: ignore[attr-defined]
        attempt = task.spec.attempt if task is not None else 0
        if state != "PENDING":
            return ("FAILED" if failed else "FINISHED"), attempt
        if task is None or task.state == DONE:
            return "NIL", attempt
        return _OWNER_TASK_STATUS[task.state], attempt

    def describe_object(self, oid: ObjectID) -> dict[str, Any]:
        e = self.objects.entries.get(oid)
        if e is None:
            return {"state": "unknown"}
        state = {PENDING: "pending", READY: "ready", FAILED: "failed"}[e.state]
        return {"state": state, "size": e.size, "owned": e.owned,
                "owner": (e.owner.worker_id.hex() if e.owner else self.worker_id.hex()),
                "node_id": (e.node_id or (self.node_id if e.data is not None else b"")).hex(),
                "inline": e.data is not None}

    def stats(self, brief: bool = False) -> dict[str, Any]:
        """This process's counts and objects (``lumos.state.list_objects``); ``brief``:
        without the object list."""
        objects = []
        with self.objects.lock:
            if brief:
                return {"worker_id": self.worker_id.hex(), "pid": os.getpid(), "num_pending_tasks": len(self.tasks),
                        "executing": self.executor is not None and self.executor.busy()}
            for oid, e in list(self.objects.entries.items())[:10_000]:
                state = {PENDING: "PENDING", READY: "READY", FAILED: "FAILED"}[e.state]
                task_status, attempt = self._creating_task_status(oid, e.owned, state, holds_error(e))
                objects.append({
                    "object_id": oid.hex(), "owned": e.owned, "state": state,
                    "size_bytes": e.size, "local_refs": e.local, "submitted_refs": e.submitted,
                    "contained_refs": e.contained, "borrowers": len(e.borrowers or ()),
                    "in_store": e.data is None and e.node_id is not None,
                    "node_id": (e.node_id or b"").hex() or None,
                    "task_status": task_status, "attempt_number": attempt,
                })
        return {"worker_id": self.worker_id.hex(), "pid": os.getpid(), "job_id": self.job_id.hex(),
                "node_id": self.node_id.hex(), "is_driver": self.mode == DRIVER,
                "num_pending_tasks": len(self.tasks), "objects": objects, "store": self.store.stats(),
                "executing": self.executor is not None and self.executor.busy()}
