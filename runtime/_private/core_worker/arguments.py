"""Arguments and return values of the tasks a worker executes.

The executing side of the value path: a pushed task's arguments come inline in the
spec, as zero-copy views of this node's store (pulled from another node first when
needed), or from their owner (``GetObjectStatus``); refs the task keeps are reported as
borrowed with the reply. Its results go back inline when small, or into the local store
(the owner learns the node); a streaming task's values are sent one by one
(``GeneratorItem``). Runs on the worker's main thread, beside ``executor.py``.

```
 PushTask.spec ─► _resolve_args ─► inline | store view (pull if remote) | owner's status
 result ─► _store_returns ─► ReturnObject inline | CreateObject + write + SealObject
 generator ─► send_stream_item ─► GeneratorItem ─► owner (streams.py)
```
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from lumos import exceptions as exc
from lumos._private import serialization as ser
from lumos._private.core_worker.submission import REFS_ONLY_ARGS, _ArgRef
from lumos._private.ids import NodeID, ObjectID, return_object_id, short
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection, ConnectionLost, RemoteError

logger = logging.getLogger(__name__)


class _OwnerGone(Exception):
    """A streaming call's owner went away: stop generating."""


class _TaskFailed(Exception):
    """The task failed with a ready-made error value (an upstream error, a load failure)."""

    def __init__(self, blob: bytes, cause: BaseException | None, stored: list[m.ReturnObject] | None = None) -> None:
        super().__init__("task failed")
        self.blob = blob
        self.cause = cause
        #: Return values stored before the failure (a generator's first values).
        self.stored = stored or []


def _error(e: BaseException) -> bytes:
    return ser.serialize(e, ser.KIND_ERROR).to_bytes()


def _looks_like_kwargs(d: dict[Any, Any]) -> bool:
    return all(type(k) is str for k in d)


class ArgumentsMixin:
    """``Executor``'s argument resolution and return-value storage (main thread)."""

    cw: Any

    def _hold_arg_pins(self) -> None:
        """Before a task on the main thread: store views of its arguments send no pin
        (their owner keeps them until the reply) and their unmaps wait for the reply."""
        store = self.cw.store
        store.defer_unmaps()
        store.hold_pins()

    def _pin_escaped_args(self) -> None:
        """After the task, before its reply: pin the arguments whose views it kept (in
        an actor's state, a generator's frame), so that the owner's free, which follows
        the reply, finds them pinned and does not reuse their store files."""
        self.cw.store.escaped_pins(self._pin_now)

    def note_kept(self, spec: m.TaskSpec, reply: m.TaskReply) -> None:
        """After the task, its references to its arguments gone: the lent arguments
        (``Dep.slot``) it still views go in the reply (``kept``), so that their owner does
        not write the next argument into those files."""
        lent = [dep.object_id for dep in spec.deps if dep.slot >= 0]
        if lent:
            kept = self.cw.store.viewed(lent)
            if kept:
                reply.kept = kept

    def pin_kept_args(self, spec: m.TaskSpec, reply: m.TaskReply) -> None:
        """A concurrent actor's call, before its reply: the store arguments it still views
        (an actor keeping one) are pinned again with a round trip, or, lent ones, reported
        in the reply (``note_kept``). Their first views pinned them one way; the owner's
        free, which follows the reply on its own connection, could overtake that pin at
        the raylet, which would then reuse the file under the view. (A call on the main
        thread holds its pins back instead: ``_pin_escaped_args``.)"""
        stored = [dep for dep in spec.deps if dep.data is None]
        if not stored:
            return
        kept = self.cw.store.viewed([dep.object_id for dep in stored])
        if not kept:
            return
        lent = [dep.object_id for dep in stored if dep.slot >= 0 and dep.object_id in kept]
        if lent:
            reply.kept = lent
        if len(lent) < len(kept):
            self._pin_now([oid for oid in kept if oid not in lent])

    def _pin_now(self, object_ids: list[ObjectID]) -> None:
        try:
            self.cw.call_raylet(m.PinObjects(object_ids, True))
        except (RemoteError, TimeoutError, exc.LumosSystemError) as e:
            # The raylet is gone or not answering: this worker is going too.
            logger.warning("could not pin %d arguments kept past their task: %s", len(object_ids), e)

    def _resolve_args(self, spec: m.TaskSpec) -> tuple[tuple[Any, ...], dict[str, Any]]:
        values = [self._dep_value(spec, dep) for dep in spec.deps]
        if values and type(spec.args) is bytes and REFS_ONLY_ARGS.get(spec.args) == len(values):
            return tuple(values), {}  # (``f.remote(ref)``: nothing to unpickle)
        self._in_args = True
        try:
            kind, payload = ser.deserialize(spec.args)
        finally:
            self._in_args = False
        if type(payload) is tuple and len(payload) == 2 and type(payload[0]) is tuple \
                and type(payload[1]) is dict and _looks_like_kwargs(payload[1]):
            args, kwargs = payload
        else:
            args, kwargs = payload, {}
        if values:
            args = tuple(values[a] if type(a) is _ArgRef else a for a in args)
            if kwargs:
                kwargs = {k: (values[v] if type(v) is _ArgRef else v) for k, v in kwargs.items()}
        return args, kwargs

    def _dep_value(self, spec: m.TaskSpec, dep: m.Dep) -> Any:
        data = dep.data
        node_id = dep.node_id
        if data is None and (node_id is None or node_id != self.cw.node_id):
            st = self._fetch_status(dep)
            data, node_id = st.data, st.node_id
        self._in_args = True
        try:
            if data is not None:
                kind, value = ser.deserialize(data)
            else:
                kind, value = self._stored_arg(spec, dep, node_id)
        finally:
            self._in_args = False
        if kind == ser.KIND_ERROR:
            raise _TaskFailed(data if data is not None else _error(value), value)
        return value

    def _stored_arg(self, spec: m.TaskSpec, dep: m.Dep, node_id: NodeID | None) -> tuple[int, Any]:
        """Read an argument kept in an object store: this node's, a copy pulled from the
        node holding it, or, when that node died, a copy its owner rebuilt from lineage."""
        cw = self.cw
        oid = dep.object_id
        local = node_id is None or node_id == cw.node_id
        view = cw.store.view(oid, restore=local, hold_pin=True, lent_slot=dep.slot if local else -1)
        if view is None and node_id is not None and node_id != cw.node_id:
            lost = None
            try:
                cw.pull_to_local(oid, node_id, dep.owner.worker_id)
                cw.note_pulled([(oid, dep.owner)])
            except exc.ObjectLostError as e:
                lost = e
            if lost is not None:
                try:
                    st = cw.ask_owner_to_rebuild(oid, dep.owner, node_id, None)
                except exc.ObjectLostError as e:
                    raise _TaskFailed(_error(e), None) from None
                if st.data is not None:
                    return ser.deserialize(st.data)
                if st.node_id != cw.node_id:
                    try:
                        cw.pull_to_local(oid, st.node_id or b"", dep.owner.worker_id)
                        cw.note_pulled([(oid, dep.owner)])
                    except exc.ObjectLostError as e:
                        raise _TaskFailed(_error(e), None) from None
            view = cw.store.view(oid, hold_pin=True)
        if view is None:
            raise _TaskFailed(_error(exc.ObjectLostError(
                oid.hex(), f"argument of {spec.name} is gone from the object store")), None)
        value = ser.deserialize(view)
        cw.store.keep_spare(oid)  # the views keep the mapping alive; a spare after the task
        return value

    def _fetch_status(self, dep: m.Dep) -> m.ObjectStatus:
        cw = self.cw

        async def ask() -> m.ObjectStatus:
            conn = await cw._peer(dep.owner)
            return await conn.call(m.GetObjectStatus(dep.object_id, True, cw.address))  # type: ignore[no-any-return]

        try:
            st: m.ObjectStatus = cw.run_sync(ask())
        except (OSError, ConnectionLost, TimeoutError) as e:
            raise _TaskFailed(_error(exc.OwnerDiedError(dep.object_id.hex(), str(e))), None) from None
        if st.status != m.ObjectState.READY:
            raise _TaskFailed(_error(exc.ObjectLostError(dep.object_id.hex(), st.error or "")), None)
        return st

    def note_arg_borrow(self, object_id: ObjectID, owner: m.Address) -> None:
        self._arg_borrowed.append((object_id, owner))

    def _still_borrowed(self) -> list[Any]:
        """Refs from the arguments that are still alive here: the caller must make their
        owners count this process as a borrower. Only refs noted while deserializing
        arguments are looked at (not the whole object table)."""
        noted, self._arg_borrowed = self._arg_borrowed, []
        if not noted:
            return []
        out: list[Any] = []
        objects = self.cw.objects
        with objects.lock:
            for oid, _owner in noted:
                e = objects.entries.get(oid)
                if e is not None and not e.owned and not e.registered and e.owner is not None and e.alive():
                    e.registered = True
                    out.append([oid, e.owner])
        return out

    def _stream_returns(self, spec: m.TaskSpec, result: Any) -> list[m.ReturnObject]:
        """A streaming generator task: send each value it yields to its owner at once."""
        try:
            values = iter(result)
        except TypeError:
            raise TypeError(f"{spec.name} is a streaming task (num_returns='streaming') but returned a "
                            f"{type(result).__name__}, not a generator or iterable") from None
        conn = self._conn
        assert conn is not None
        for value in values:
            self.send_stream_item(conn, spec, self._streamed, value)
            self._streamed += 1
            if self._cancel_requested == spec.task_id:
                raise KeyboardInterrupt
        return []

    def send_stream_item(self, conn: Connection, spec: m.TaskSpec, index: int, value: Any) -> None:
        """Store a streaming call's ``index``-th value and send it to the owner (any thread).

        Raises:
            _OwnerGone: the owner's connection closed; nobody will read more values.
        """
        if conn.is_closed:
            raise _OwnerGone(f"the owner of {spec.name} is gone: the stream stops")
        third_party: dict[bytes, tuple[m.Address, list[bytes]]] = {}
        ret = self._return_object(spec, return_object_id(spec.task_id, index + 1), value, third_party)
        for owner, ids in third_party.values():
            self._register_at(owner, ids, spec.owner)
        self.cw.send_reply(conn, m.GeneratorItem(spec.task_id, index, ret))

    def _store_returns(self, spec: m.TaskSpec, result: Any) -> list[m.ReturnObject]:
        n = spec.num_returns
        if n == 0:
            return []
        if n < 0:
            raise TypeError(f"{spec.name} streams (num_returns='streaming') but returned a "
                            f"{type(result).__name__}, not a generator")
        if n == 1 and not inspect.isgenerator(result):
            values = [result]
        elif inspect.isgenerator(result):  # (num_returns=1 too: its one value, as in Ray)
            values = self._drain_generator(spec, result)
            if len(values) < n:  # (more are dropped, as in Ray)
                raise ValueError(f"{spec.name} has num_returns={n} but its generator yielded "
                                 f"{len(values)} value{'' if len(values) == 1 else 's'}")
            del values[n:]
        else:
            try:
                values = list(result)
            except TypeError:
                raise TypeError(f"{spec.name} has num_returns={n} but returned a "
                                f"{type(result).__name__}, not a sequence") from None
            if len(values) != n:
                raise ValueError(f"{spec.name} has num_returns={n} but returned {len(values)} values")
        third_party: dict[bytes, tuple[m.Address, list[bytes]]] = {}
        returns: list[m.ReturnObject] = []
        try:
            for i, value in enumerate(values):
                returns.append(self._return_object(spec, return_object_id(spec.task_id, i + 1), value,
                                                   third_party))
        except BaseException:
            # The attempt fails as a whole (its reply carries the error for every return):
            # the values already written to the store would have no owner and stay forever.
            self._abort_returns(returns)
            raise
        for owner, ids in third_party.values():
            self._register_at(owner, ids, spec.owner)
        return returns

    def _drain_generator(self, spec: m.TaskSpec, gen: Any) -> list[Any]:
        """The values of a generator with a fixed ``num_returns``. If it raises after some,
        those stay values and the error fills the rest (as in Ray), unless the task is
        retried for that error."""
        values: list[Any] = []
        try:
            for value in gen:
                values.append(value)
        except Exception as e:
            if not values or len(values) >= spec.num_returns or self._is_retryable(spec, e):
                raise
            third_party: dict[bytes, tuple[m.Address, list[bytes]]] = {}
            stored = [self._return_object(spec, return_object_id(spec.task_id, i + 1), v, third_party)
                      for i, v in enumerate(values)]
            for owner, ids in third_party.values():
                self._register_at(owner, ids, spec.owner)
            raise _TaskFailed(self._task_error_blob(spec, e), e, stored) from None
        return values

    def _return_object(self, spec: m.TaskSpec, oid: ObjectID, value: Any,
                       third_party: dict[bytes, tuple[m.Address, list[bytes]]]) -> m.ReturnObject:
        """One return value, inline or written to this node's store. Refs inside it owned by
        a third process are added to ``third_party`` (their owner must learn the borrower)."""
        cw = self.cw
        try:
            # A task's error returned as a value raises when got, as in Ray.
            sv = ser.serialize(value, ser.KIND_ERROR if isinstance(value, exc.TaskError) else ser.KIND_VALUE)
        except ser.SerializationError as e:
            # (a return id is the task id and the 1-based index, big-endian)
            which = (f"return value {int.from_bytes(oid[16:], 'big')}" if spec.num_returns > 1
                     else "the return value")
            raise TypeError(f"{which} of {spec.name} could not be serialized: {e}") from None
        nested = []
        for ref in sv.nested_refs:
            owner = ref._owner or cw.address
            nested.append([ref._id, owner])
            if owner.worker_id == cw.worker_id:
                cw.objects.add_borrower(ref._id, spec.owner)
            elif owner.worker_id != spec.owner.worker_id:
                third_party.setdefault(owner.worker_id, (owner, []))[1].append(ref._id)
        if sv.total_size < cw.config.max_inline_object_bytes:
            return m.ReturnObject(oid, sv.to_bytes(), sv.total_size, None, nested)
        cw._write_to_store(oid, sv, keep_mapping=False, owner=spec.owner.worker_id)
        return m.ReturnObject(oid, None, sv.total_size, cw.node_id, nested)

    def _abort_returns(self, returns: list[m.ReturnObject]) -> None:
        """Free the stored values of a failed attempt's returns (any thread)."""
        stored = [r.object_id for r in returns if r.data is None and r.node_id is not None]
        if stored:
            cw = self.cw
            logger.info("freeing %d stored returns of a failed attempt", len(stored))
            cw._post(cw._send_releases, stored, [False] * len(stored), {})

    def _register_at(self, owner: m.Address, ids: list[bytes], borrower: m.Address) -> None:
        cw = self.cw

        async def add() -> Any:
            conn = await cw._peer(owner)
            return await conn.call(m.AddBorrowers(ids, borrower), cw.config.rpc_timeout_s)

        try:
            cw.run_sync(add())
        except (OSError, ConnectionLost, TimeoutError, RemoteError) as e:
            logger.warning("could not hand refs over to %s: %s", short(owner.worker_id), e)

    def _error_returns(self, spec: m.TaskSpec, blob: bytes, streamed: int | None = None,
                       first: list[m.ReturnObject] | None = None) -> list[m.ReturnObject]:
        """The error as every return value; ``first``: values a generator with a fixed
        ``num_returns`` yielded before it raised (they stay values, as in Ray)."""
        if spec.num_returns == -1:  # a streaming task: the error is the item after the last one sent
            index = self._streamed if streamed is None else streamed
            return [m.ReturnObject(return_object_id(spec.task_id, index + 1), blob, len(blob), None, [])]
        done = list(first or [])
        return done + [m.ReturnObject(return_object_id(spec.task_id, i + 1), blob, len(blob), None, [])
                       for i in range(len(done), max(spec.num_returns, 1))] if spec.num_returns else []
