"""Submitting tasks and creating actors: the user-thread half (and task events).

A user thread calls ``submit_task`` / ``create_actor``: the arguments are serialized
(top-level refs become ``_ArgRef`` placeholders listed as ``Dep``s, large values are
``put`` first and passed by ref), the ``m.TaskSpec`` is built, the return ids are
recorded as owned and the argument refs pinned, and the task is handed to the io thread
in one ``_post`` (no syscall when the io thread is already due to drain its inbox); the
refs return at once. A task's events ride on it (``PendingTask.ev_live``) until its end
packs them into one row (``_pack_ended``) or a flush reports them (``spill_events``);
other events are buffered as tuples; both leave off the hot path (``_flush_loop``).

```
 user thread: submit_task ─► _pack_args ─► TaskSpec ─► owned returns ─► _post(_on_submit) ─► refs
 io thread:   _on_submit ─► OwnerState.resolve_args ─► TaskSubmitterState.enqueue ─► PushTask
              (actor calls ─► actor_submitter.py)
 create_actor ─► named: RegisterActor at the GCS (run_sync) ─► actor_submitter.track
               unnamed: _post(_register_async) ─► io thread: RegisterActor (not awaited by the user)
                        ─► actor_submitter.registered / registration_failed (calls queue until then)
```
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import functools
import hashlib
import itertools
import logging
import threading
import time
from typing import Any

import msgpack

from lumos import exceptions as exc
from lumos._private import interrupts, metrics
from lumos._private import serialization as ser
from lumos._private.core_worker.io_loop import Claim
from lumos._private.core_worker.references import READY
from lumos._private.core_worker.tasks import DONE, QUEUED, WAITING_ARGS, PendingTask, TaskTemplate
from lumos._private.ids import ActorID, JobID, NodeID, TaskID, WorkerID, new_task_id, return_object_id
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import ActorNameTaken
from lumos._private.task_spec import new_task_spec
from lumos._private.transport.connection import ConnectionLost, RemoteError
from lumos.generator import GeneratorStream, ObjectRefGenerator
from lumos.object_ref import ObjectRef

logger = logging.getLogger(__name__)


def _has_large_buffer(args: tuple[Any, ...], kwargs: dict[str, Any], limit: int) -> bool:
    """An argument is a buffer (numpy array, bytes) over ``limit`` bytes: the payload will
    not be inline, so it need not be serialized whole first (a hint: sizes are checked)."""
    return any(_is_large_buffer(v, limit) for v in args) or \
        any(_is_large_buffer(v, limit) for v in kwargs.values())


def _is_large_buffer(v: Any, limit: int) -> bool:
    t = type(v)
    if t is bytes or t is bytearray:
        return len(v) > limit
    return t.__name__ == "ndarray" and v.nbytes > limit


_KIND_NAME = {k: k.name for k in m.TaskKind}
#: The ``deps`` and ``nested_refs`` of a call without them: one shared empty tuple (it
#: goes on the wire as an empty list), not two new lists per call, which the collector
#: walked for as long as the call was in flight: in a burst, a third of the objects it
#: tracked per call (async actor calls +4-8%, young collections -20%).
_NONE: Any = ()
#: The arguments of a call without any (``a.step.remote()``), serialized once.
_NO_ARGS = ser.serialize(())
_NO_ARGS_BYTES = _NO_ARGS.to_bytes()


#: Calls an actor made to itself that it remembers (``_note_call_to_self``).
_CALLS_TO_SELF = 256
#: Reports of client-mode drivers' metrics (``forward_metrics``) held while the GCS restarts.
FORWARDED_METRICS_HELD = 1000


class _ArgRef(int):
    """Placeholder for the i-th top-level ref argument inside the pickled args."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return (_ArgRef, (int(self),))


ser._PLAIN_SCALARS = ser._PLAIN_SCALARS | {_ArgRef}  # pickles by reference: safe on the fast path

#: The arguments of a call that passes refs and nothing else (``f.remote(ref)``), by how
#: many: pickled once and shared (never changed), where every such call pickled its
#: placeholders anew (~4.6 us; the executor's unpickling of them, ~3 us, is skipped too:
#: ``REFS_ONLY_ARGS``).
_REFS_ONLY = [ser.serialize(tuple(_ArgRef(i) for i in range(n))) for n in range(9)]
#: Those arguments' bytes -> how many refs they stand for (the executor's look-up).
REFS_ONLY_ARGS = {sv.to_bytes(): n for n, sv in enumerate(_REFS_ONLY) if n}


def function_id_of(pickled: bytes) -> bytes:
    return hashlib.sha256(pickled).digest()[:16]


class SubmissionMixin:
    """``CoreWorker``'s task and actor submission (user threads) and task-event buffer."""

    objects: Any
    config: Any
    address: m.Address
    job_id: JobID
    gcs: Any

    def export_function(self, template: TaskTemplate) -> None:
        if template.function_id in self._exported or template.pickled_function is None:
            return
        self._exported.add(template.function_id)
        assert self.gcs is not None
        msg = m.KvPut("fn", self.job_id + template.function_id, template.pickled_function, True)
        if self._gcs_reconnecting:
            self._gcs_backlog.append(msg)
        else:
            self.gcs.notify(msg)

    def _pack_args(self, args: tuple[Any, ...], kwargs: dict[str, Any], template: TaskTemplate,
                   lend: bool = False) -> tuple[ser.SerializedValue, list[ObjectRef]]:
        """Serialize a call's arguments; top-level refs become placeholders listed in deps.
        ``lend``: large by-value arguments may be lent in reserved slots (a task or actor
        call this process pushes itself; not an actor's creation, which the GCS places)."""
        if not args and not kwargs:
            return _NO_ARGS, []
        deps: list[ObjectRef] = []
        if any(type(a) is ObjectRef for a in args):
            new_args: list[Any] = []
            for a in args:
                if type(a) is ObjectRef:
                    new_args.append(_ArgRef(len(deps)))
                    deps.append(a)
                else:
                    new_args.append(a)
            if not kwargs and len(deps) == len(args) < len(_REFS_ONLY):
                return _REFS_ONLY[len(deps)], deps
            args = tuple(new_args)
        if kwargs and any(type(v) is ObjectRef for v in kwargs.values()):
            kwargs = dict(kwargs)
            for k, v in kwargs.items():
                if type(v) is ObjectRef:
                    kwargs[k] = _ArgRef(len(deps))
                    deps.append(v)
        payload: Any = (args, kwargs) if kwargs else args
        try:
            if _has_large_buffer(args, kwargs, self.config.max_inline_arg_bytes):
                # An array or bytes over the inline limit: the payload cannot be inline,
                # so serialize each argument once, here. One under it (a 64 KiB frame)
                # travels inside the PushTask, like any small value.
                payload, sv, deps = self._promote_large_args(args, kwargs, deps, lend)
                return sv, deps
            sv = ser.serialize(payload)
        except ser.SerializationError as e:
            raise self._argument_error(template, args, kwargs, e) from e.__cause__
        if sv.total_size > self.config.max_inline_arg_bytes:
            payload, sv, deps = self._promote_large_args(args, kwargs, deps, lend)
        return sv, deps

    @staticmethod
    def _argument_error(template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                        error: ser.SerializationError) -> ser.SerializationError:
        """Which argument of a call could not be serialized, and why (the failure path only)."""
        names = _parameter_names(template)
        for i, value in enumerate(args):
            cause = ser._pickles(value)
            if cause is not None:
                name = f" (`{names[i]}`)" if i < len(names) else ""
                where = f"argument {i + 1}{name}"
                break
        else:
            for key, value in kwargs.items():
                cause = ser._pickles(value)
                if cause is not None:
                    where = f"keyword argument `{key}`"
                    break
            else:
                return error
        return ser.SerializationError(
            f"could not serialize {where} of {template.name}(): {ser.describe_culprit(value, cause)}. "
            "Arguments of tasks and actors must be picklable (cloudpickle); objects holding locks, "
            "sockets or open files are not: pass what rebuilds them instead (a path, a config).")

    def submit_task(self, template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                    actor_fields: tuple[Any, ...] | None = None) -> list[ObjectRef]:
        """Submit one call (user thread). Returns refs to its ``num_returns`` results."""
        if self.objects.decrements:
            self.drain_refs()
        if self.capture_strategy is not None and template.strategy is None and template.kind != m.TaskKind.ACTOR_TASK:
            template = self._captured(template)
        sv, deps = self._pack_args(args, kwargs, template, self.config.lend_args)
        task_id = new_task_id()
        n = template.num_returns
        return_ids = (return_object_id(task_id, 1),) if n == 1 else \
            tuple([return_object_id(task_id, i + 1) for i in range(n)]) if n > 0 else ()
        nested = sv.nested_refs
        address = self.address
        spec_deps = [m.Dep(d._id, d._owner or address, None, None) for d in deps] if deps else _NONE
        nested_refs = [[r._id, r._owner or address] for r in nested] if nested else _NONE
        blob = _NO_ARGS_BYTES if sv is _NO_ARGS else sv.to_bytes()
        if actor_fields is not None:
            actor_id, sequence_no, caller_id, group = actor_fields
            if actor_id == self.current_actor_id:
                self._note_call_to_self(task_id, template.name)
            spec = new_task_spec(template, task_id=task_id, job_id=self.job_id, parent_task_id=self.current_task_id,
                                 owner=address, args=blob, deps=spec_deps, nested_refs=nested_refs,
                                 root_task_id=self.root_task_id(), actor_id=actor_id, sequence_no=sequence_no,
                                 caller_id=caller_id, actor_options=group)
        else:
            env = self._env_for(template) if template.runtime_env is not None or self.inherited_env is not None \
                else None
            spec = new_task_spec(template, task_id=task_id, job_id=self.job_id, parent_task_id=self.current_task_id,
                                 owner=address, args=blob, deps=spec_deps, nested_refs=nested_refs,
                                 root_task_id=self.root_task_id(), runtime_env=env)
        events_on = template.enable_task_events
        dep_ids = tuple([d._id for d in deps]) if deps else ()
        task = PendingTask(spec, template, return_ids, dep_ids, tuple([r._id for r in nested]) if nested else (),
                           time.time())
        # The stop button: the task is handed over whole (its returns counted, its
        # arguments counted as submitted, the io thread told) or not begun.
        held = interrupts.hold()
        try:
            objects = self.objects
            with objects.lock:
                for oid in return_ids:
                    objects.add_owned(oid)
                if dep_ids:
                    objects.add_submitted(dep_ids)
                    # Only while nothing else is in flight (a caller waiting on each call): in a
                    # burst, calls the io thread sends went ~15% faster than ones written one by one.
                    ready_deps = not self.tasks and self._fill_ready_deps(spec.deps)
                if task.nested_ids:
                    objects.add_submitted(task.nested_ids)
            if events_on:
                if actor_fields is not None and spec.kind == m.TaskKind.ACTOR_TASK:
                    calls = self._last_actor_call
                    task.ev_prev = calls.get(actor_fields[0])
                    calls[actor_fields[0]] = task_id
                if n == -1:  # (a generator's events are buffered as they come)
                    self._buffer_event((task_id, 0, m.TaskState.SUBMITTED, task.submit_time, self._event_facts(task),
                                        None, None, None))
                else:
                    task.ev_live = True
            if n == -1:
                stream = self.streams[task_id] = GeneratorStream(task_id)
                self._post(self._on_submit, task)
                if self._top_ups:
                    self.top_up_reserved()
                return [ObjectRefGenerator(stream, address, self)]  # type: ignore[list-item]
            if (dep_ids and not ready_deps) or not (
                    self.push_direct(task) if actor_fields is None else self.actor_submitter.send_direct(task)):
                self._post(self._on_submit, task)
            if task.ev_live:
                # (After the write: no flush reports the task before its SCHEDULED is on it.)
                with self._fresh_lock:
                    if task.ev_live:  # (not ended and packed already by the io thread)
                        self._fresh[task_id] = task
                if self._flush_idle:
                    self.wake_flush()
            if self._top_ups:  # (a by-value argument ran its size's reserved slots low)
                self.top_up_reserved()
            return [ObjectRef(oid, address, True) for oid in return_ids]
        finally:
            if held:
                try:
                    interrupts.release()  # (a stop pressed meanwhile raises here: the refs, dropped, free the returns)
                except KeyboardInterrupt as e:
                    e.lumos_submitted = True  # type: ignore[attr-defined]  (the call was made)
                    raise

    def _note_call_to_self(self, task_id: TaskID, name: str) -> None:
        """An actor calls one of its own methods (user thread): remembered (the latest
        ``_CALLS_TO_SELF``) so that a get() of its result from a call of a one-at-a-time
        actor can say it would wait for ever (``_refuse_waiting_for_own_calls``)."""
        calls = self._calls_to_self
        calls[task_id] = name
        if len(calls) > _CALLS_TO_SELF:
            calls.pop(next(iter(calls)))

    def _fill_ready_deps(self, deps: list[m.Dep]) -> bool:
        """User thread, objects lock held: when every argument ref is owned here and
        ready (inline, or in this node's store: a by-value argument just put, a ``put``
        ref), fill in their values or locations as the io thread's ``args_ready`` would,
        so the task can be written straight to a worker (``push_direct``): no io-thread
        resolve, no wake-up (a sync call with a 1 MiB argument by value: p50 ~10-30%
        lower, about one io-thread wake-up less per call). False (nothing filled): let
        the io thread resolve them."""
        entries = self.objects.entries
        node_id = self.node_id
        found = []
        for dep in deps:
            e = entries.get(dep.object_id)
            if e is None or not e.owned or e.state != READY:
                return False
            if e.data is None:
                if e.node_id != node_id:
                    return False
            elif ser.kind_of(e.data) == ser.KIND_ERROR:
                return False
            found.append(e)
        for dep, e in zip(deps, found):
            dep.data = e.data
            dep.node_id = e.node_id
            dep.slot = e.lent
            e.shared = True
        return True

    def create_actor(self, template: TaskTemplate, args: tuple[Any, ...], kwargs: dict[str, Any],
                     actor_id: ActorID, actor_options: dict[str, Any], wait: bool = True) -> m.ActorInfo | None:
        """Register an actor with the GCS, which creates it (user thread).

        Returns the GCS's row for the actor: a different actor's row when
        ``get_if_exists`` found one with the same name. ``wait=False`` (an actor
        without a name: nothing the GCS checks can fail but the GCS itself) returns
        None at once; the io thread sends the RegisterActor (in order, without waiting
        on the ones before) and a failed registration fails the actor's calls.
        """
        if self.objects.decrements:
            self.drain_refs()
        if self.capture_strategy is not None and template.strategy is None:
            template = self._captured(template)
        with interrupts.Window():  # (nothing is under way yet: the stop button works here)
            sv, deps = self._pack_args(args, kwargs, template)
        nested = sv.nested_refs
        task_id = new_task_id()
        spec = new_task_spec(
            template, task_id=task_id, job_id=self.job_id, parent_task_id=self.current_task_id, owner=self.address,
            args=sv.to_bytes(), deps=[m.Dep(d._id, d._owner or self.address, None, None) for d in deps],
            nested_refs=[[r._id, r._owner or self.address] for r in nested] if nested else [],
            root_task_id=self.root_task_id(), actor_id=actor_id, actor_options=actor_options,
            runtime_env=self._env_for(template) if template.runtime_env is not None or self.inherited_env is not None
            else None)
        pinned = [d._id for d in deps] + [r._id for r in nested]
        if pinned:
            with self.objects.lock:
                self.objects.add_submitted(pinned)

        if not wait and self.gone is None:  # (a cluster known gone: the sync path's clear error)
            fut: concurrent.futures.Future[None] = concurrent.futures.Future()
            self._registering[actor_id] = fut
            self._post(self._register_async, template, spec, fut)
            self._creation_submitted(template, spec, pinned)
            return None

        async def register() -> m.ActorInfo:
            self.export_function(template)
            # Waits for a GCS being restarted (Redis storage), then rpc_timeout_s for the reply.
            return await self._gcs_call(m.RegisterActor(spec), None)  # type: ignore[no-any-return]

        claim = Claim(functools.partial(self._post, self._registered_unawaited, template, spec, pinned),
                      lambda _error: self._post(self._unpin, pinned))
        try:
            with interrupts.Window():  # (it may wait for a GCS being restarted)
                info: m.ActorInfo = self.run_sync(
                    register(), self.config.gcs_reconnect_timeout_s + self.config.rpc_timeout_s + 1, claim)
        except BaseException as e:
            if claim.left():
                raise  # (the stop button: the registration goes on, and what it makes is settled then)
            self._post(self._unpin, pinned)
            if isinstance(e, RemoteError) and e.type_name == ActorNameTaken.__name__:
                raise exc.ActorAlreadyExistsError(e.text) from None
            if isinstance(e, RemoteError) and e.type_name in ("ValueError", "TypeError"):
                raise (ValueError if e.type_name == "ValueError" else TypeError)(e.text) from None
            if isinstance(e, ConnectionLost):
                raise self._unavailable("the GCS", m.RegisterActor(spec), e) from None
            if isinstance(e, RemoteError):
                raise exc.LumosSystemError(f"could not create actor {template.name}: {e}") from None
            raise
        if info.actor_id != actor_id:  # get_if_exists: an existing actor
            self._post(self._unpin, pinned)
        else:
            self._creation_submitted(template, spec, pinned)
        self._post(self.actor_submitter.track, info.actor_id, info)
        return info

    def _registered_unawaited(self, template: TaskTemplate, spec: m.TaskSpec, pinned: list[Any],
                              info: m.ActorInfo) -> None:
        """(io thread) A named actor's registration whose caller the stop button took
        away went through: no handle was made, so the actor ends as one dropped would end
        it (a detached one stays, for ``get_actor``); before, it lived until the job
        ended. Another actor that ``get_if_exists`` found is left alone."""
        if info.actor_id != spec.actor_id:
            self._unpin(pinned)
            return
        self._creation_submitted(template, spec, pinned)
        self.actor_submitter.track(info.actor_id, info)
        if not spec.actor_options.get("detached"):
            self.actor_submitter.release_handle(info.actor_id)

    def _creation_submitted(self, template: TaskTemplate, spec: m.TaskSpec, pinned: list[Any]) -> None:
        """The creation task's pinned arguments go to the actor's line (released with the
        actor), and its SUBMITTED event is recorded when task events are on."""
        if spec.enable_task_events:
            self._buffer_event((spec.task_id, 0, m.TaskState.SUBMITTED, time.time(), {
                "name": template.name, "function_name": template.function_name,
                "parent": self.current_task_id, "args": pinned, "returns": [],
                "resources": template.resources, "type": m.TaskKind.ACTOR_CREATION_TASK.name,
                "actor_id": spec.actor_id, "placement_group_id": m.placement_group_of(spec.strategy)}, None, None, None))
        if pinned:
            self._post(self.actor_submitter.pin_creation_args, spec.actor_id, pinned)

    def _register_async(self, template: TaskTemplate, spec: m.TaskSpec,
                        fut: "concurrent.futures.Future[None]") -> None:
        """io thread: the actor's calls queue until its RegisterActor is answered."""
        self.actor_submitter.registering(spec.actor_id)
        self.spawn(self._register(template, spec, fut), "actor.register")

    async def _register(self, template: TaskTemplate, spec: m.TaskSpec,
                        fut: "concurrent.futures.Future[None]") -> None:
        actor_id = spec.actor_id
        try:
            self.export_function(template)
            info = await self._gcs_call(m.RegisterActor(spec), None)
        except (Exception, asyncio.CancelledError) as e:
            if isinstance(e, ConnectionLost):
                why = f"the GCS connection was lost ({e})"
            elif isinstance(e, RemoteError):
                why = f"the GCS refused it ({e})"
            else:
                why = f"{type(e).__name__}: {e}"
            err = exc.ActorDiedError(actor_id.hex(), f"the actor {template.name.split('.')[0]} was never "
                                     f"created: registering it with the GCS failed: {why}")
            self._registering.pop(actor_id, None)
            self.actor_submitter.registration_failed(actor_id, err)
            fut.set_result(None)
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        self._registering.pop(actor_id, None)
        self.actor_submitter.registered(actor_id, info)
        fut.set_result(None)

    def wait_registered(self, actor_id: ActorID) -> None:
        """User thread: wait until the GCS answered this process's RegisterActor for the
        actor, if it is in flight (before the actor's id is sent anywhere else)."""
        fut = self._registering.get(actor_id)
        if fut is None or threading.current_thread() is self.io.thread:
            return
        fut.result(self.config.gcs_reconnect_timeout_s + self.config.rpc_timeout_s + 1)

    def _env_for(self, template: TaskTemplate) -> dict[str, str] | None:
        """A new task's or actor's environment variables: its own over its parent's."""
        inherited, own = self.inherited_env, template.runtime_env
        if inherited and own:
            return {**inherited, **own}
        return own or inherited

    def _captured(self, template: TaskTemplate) -> TaskTemplate:
        """``template`` scheduled into the placement group that captures this task's children."""
        strategy = self.capture_strategy
        key = (id(template), bytes(strategy[1]) if strategy else b"")
        hit = self._captured_templates.get(key)
        if hit is not None and hit[0] is template:
            return hit[1]  # type: ignore[no-any-return]
        t = copy.copy(template)
        t.strategy = strategy
        t.key = (template.function_id, tuple(sorted(template.resources.items())), repr(strategy),
                 template.max_retries != 0)
        if len(self._captured_templates) > 10_000:
            self._captured_templates.clear()
        self._captured_templates[key] = (template, t)
        return t

    def _unpin(self, ids: list[bytes]) -> None:
        if ids:
            freed = self.objects.remove_submitted(ids)
            if freed:
                self._release(freed)

    def root_task_id(self) -> bytes:
        ex = self.executor
        if ex is not None:
            root = ex.current_root_task_id()
            if root:
                return root  # type: ignore[no-any-return]
        return self.current_task_id

    def _promote_large_args(self, args: tuple[Any, ...], kwargs: dict[str, Any],
                            deps: list[ObjectRef], lend: bool = False
                            ) -> tuple[Any, ser.SerializedValue, list[ObjectRef]]:
        """Put large by-value arguments into the object store and pass them by ref
        (``lend``: in lent slots where they fit, ``_write_to_store``)."""
        limit = self.config.max_inline_arg_bytes // 4
        deps = list(deps)
        keep: list[ObjectRef] = []

        def promote(v: Any) -> Any:
            if type(v) is _ArgRef:
                return v
            sv = ser.serialize(v)
            if sv.total_size <= limit:
                return v
            # The serialized form goes to the store as is: each argument pickled once.
            ref = self._put_serialized(sv, lend)
            keep.append(ref)
            deps.append(ref)
            return _ArgRef(len(deps) - 1)

        new_args = tuple(promote(a) for a in args)
        new_kwargs = {k: promote(v) for k, v in kwargs.items()}
        payload: Any = (new_args, new_kwargs) if new_kwargs else new_args
        return payload, ser.serialize(payload), deps

    def _event_facts(self, task: PendingTask) -> dict[str, Any]:
        """The facts of ``task`` its SUBMITTED event carries (and its SCHEDULED's resource ids)."""
        spec = task.spec
        info: dict[str, Any] = {"name": spec.name, "function_name": spec.function_name,
                                "parent": spec.parent_task_id, "args": task.dep_ids + task.nested_ids,
                                "returns": task.return_ids, "resources": spec.resources,
                                "type": _KIND_NAME[spec.kind]}
        if spec.actor_id:
            info["actor_id"] = spec.actor_id
            info["caller_id"] = spec.caller_id
            if task.ev_prev is not None:
                info["prev_call"] = task.ev_prev
        if task.ev_rids:
            info["resource_ids"] = task.ev_rids
        group = m.placement_group_of(spec.strategy)
        if group is not None:
            info["placement_group_id"] = group
        return info

    def record_scheduled(self, task: PendingTask, t: float, node_id: NodeID | None, worker_id: WorkerID | None,
                         resource_ids: Any = None) -> None:
        """``task`` (events on) is sent to a worker: kept on the task while its events ride
        on it, else buffered. A user thread records it before its write, when no other
        thread touches the task yet."""
        if task.ev_live:
            if task.ev_sched is None:
                task.ev_sched, task.ev_node, task.ev_worker, task.ev_rids = t, node_id, worker_id, resource_ids
                return
            self.spill_events(task)  # scheduled again (put back): both show, as events
        spec = task.spec
        self._buffer_event((spec.task_id, spec.attempt, m.TaskState.SCHEDULED, t,
                            {"resource_ids": resource_ids} if resource_ids else None, node_id, worker_id, None))

    def unrecord_scheduled(self, task: PendingTask) -> None:
        """io thread: the write a user thread recorded ``task``'s SCHEDULED before did not
        go (``push_direct``, ``send_direct``); it is sent the usual way, which records it."""
        if task.ev_live:
            task.ev_sched = task.ev_node = task.ev_worker = task.ev_rids = None

    def spill_events(self, task: PendingTask) -> None:
        """io thread: the events riding on ``task`` become a row for the next flush, and its
        later events are buffered as they come (a retry, a failure, a task still running
        at its second flush)."""
        if not task.ev_live:
            return
        self._hold_row(self._take_live_row(task))

    def _take_live_row(self, task: PendingTask) -> list[Any]:
        """io thread: the row of the events riding on ``task`` (SUBMITTED with its facts, and
        SCHEDULED when it was sent), which stop riding on it."""
        task.ev_live = False
        spec = task.spec
        self._fresh.pop(spec.task_id, None)
        sched = task.ev_sched
        return [spec.task_id, spec.attempt, _SUBMITTED, task.submit_time, self._event_facts(task), task.ev_node,
                task.ev_worker, None, [[m.TaskState.SCHEDULED, sched]] if sched is not None else None]

    def _hold_row(self, row: list[Any]) -> None:
        """io thread: send ``row`` at the next flush, with the events of its attempt buffered
        by then folded in (``_merge_events`` finds it by the same key)."""
        self._held_events[row[0] if not row[1] else (row[0], row[1])] = row
        if self._flush_idle:
            self.wake_flush()

    def _pack_ended(self, task: PendingTask, state: m.TaskState, end: float, start: float | None,
                    worker_id: WorkerID | None, error: str | None, info: dict[str, Any] | None) -> None:
        """io thread: ``task``, whose events rode on it, ended: its whole attempt (SUBMITTED
        with its facts, SCHEDULED, RUNNING, its end) packed into one row for the next flush,
        which the GCS keeps as bytes (``_pack_whole_attempts`` says why). Nothing of it lives
        on until the flush but those bytes: a burst of short calls kept three event tuples
        and a dict per call, and the collector walked them again and again."""
        row = self._take_live_row(task)
        if info:
            row[4].update(info)
        more = row[8] or []
        if start:
            more.append([m.TaskState.RUNNING, start])
        more.append([state, end])
        row[8] = more
        if worker_id:
            row[6] = worker_id
        row[7] = error
        try:
            self._packed_rows.append((row[0], row[1], state, self._event_packer.pack(row)))
        except (TypeError, ValueError, OverflowError):  # (a value msgpack cannot take: sent plain)
            self._event_packer = msgpack.Packer(use_bin_type=True, autoreset=True)
            self._hold_row(row)
            return
        if self._flush_idle:
            self.wake_flush()

    def record_event(self, task_id: TaskID, attempt: int, state: m.TaskState, t: float,
                     node_id: NodeID | None = None, worker_id: WorkerID | None = None,
                     error: str | None = None, info: Any = None) -> None:
        self._buffer_event((task_id, attempt, state, t, info, node_id, worker_id, error))

    def record_running(self, task_id: TaskID, attempt: int, start: float) -> None:
        """Executor (any thread): a task started here. Held until the next flush and
        dropped if the task's reply leaves first (``reply_sent``): the owner's events
        carry the start time then, so a short task costs the GCS no event from here."""
        self._running_events[task_id] = (task_id, attempt, m.TaskState.RUNNING, start, None, self.node_id,
                                          self.worker_id, None)
        if self._flush_idle:
            self.wake_flush()

    def reply_sent(self, reply: Any) -> None:
        """Executor: ``reply`` left; its task's RUNNING need not (the owner reports it)."""
        if type(reply) is m.TaskReply and reply.start_time:  # (not a generator's item)
            self._running_events.pop(reply.task_id, None)

    def _buffer_event(self, row: tuple[Any, ...]) -> None:
        """Any thread: buffer a task event for the next flush: ``(task_id, attempt, state,
        time, info, node_id, worker_id, error)``, optionally with a 9th field, a later
        ``(state, time)`` of the same attempt."""
        self._events.append(row)
        if self._flush_idle:
            self.wake_flush()

    def wake_flush(self) -> None:
        """Any thread: something was buffered (an event, output, a dead ref) while the
        flush loop waits with nothing to do: it flushes one interval from now."""
        if not self._flush_idle:
            return
        self._flush_idle = False
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._flush_armed.set)
        except RuntimeError:  # the loop closed meanwhile: shutdown flushes what is left
            return

    def _metrics_wake(self) -> None:
        """Any thread: the first application metric since the last report was recorded
        (``lumos._private.metrics.Buffer.wake``): report one interval after the last."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(self._arm_metrics)
        except RuntimeError:  # the loop closed meanwhile: shutdown reported what it could
            return

    def _arm_metrics(self) -> None:
        if self._metrics_timer is None and not self._closed:
            loop = self.loop
            assert loop is not None
            self._metrics_timer = loop.call_at(max(loop.time(), self._metrics_next), self.report_metrics)

    def report_metrics(self) -> None:
        """Send the application metrics recorded here since the last report (io thread);
        with the GCS away they wait for the next report after it is back."""
        timer, self._metrics_timer = self._metrics_timer, None
        if timer is not None:
            timer.cancel()
        loop = self.loop
        if loop is not None:
            self._metrics_next = loop.time() + self.config.metrics_report_interval_ms / 1000
        gcs = self.gcs
        if gcs is None or gcs.is_closed or self._gcs_reconnecting:
            if metrics.BUFFER.pending():
                self._arm_metrics()
            return
        rows = metrics.BUFFER.take()
        if rows:
            self.metrics_reports += 1
            gcs.notify(m.ReportMetrics(rows))

    def forward_metrics(self, rows: list[Any]) -> None:
        """A client-mode driver's metric rows (io thread), sent on as they came. While a
        durable GCS restarts they wait with the rest of the backlog (``_gcs_backlog``), at
        most ``FORWARDED_METRICS_HELD`` reports (a client reports once a second); past
        that, and with no GCS to come back, they are dropped, said once in the log."""
        gcs = self.gcs
        if self._gcs_reconnecting:
            if self._metrics_held < FORWARDED_METRICS_HELD:
                self._metrics_held += 1
                self._gcs_backlog.append(m.ReportMetrics(rows))
                return
        elif gcs is not None and not gcs.is_closed:
            gcs.notify(m.ReportMetrics(rows))
            return
        if not self._metrics_drop_said:
            self._metrics_drop_said = True
            logger.warning("a client driver's application metrics were dropped: the GCS is away (%s)",
                           "reports held while it restarts are at their bound" if self._gcs_reconnecting
                           else "not reconnecting")

    def _flush_pending(self) -> bool:
        ex = self.executor
        return bool(self._events or self._running_events or self._held_events or self._fresh or self._packed_rows
                    or self.objects.decrements
                    or (ex is not None and ex._output) or self._pin_changes or self._lineage_drops)

    async def _flush_loop(self) -> None:
        """Flush buffered task events, dead refs and worker output every interval while
        there are any; with none it sleeps until ``wake_flush`` (an idle worker or actor
        costs no wake-ups: 200 idle actors woken 10 times a second took 0.15 cores)."""
        interval = self.config.task_event_flush_interval_ms / 1000
        armed = self._flush_armed
        while True:
            if not self._flush_pending():
                armed.clear()
                self._flush_idle = True
                # Re-check after raising the flag: a buffer filled before it was up woke nobody.
                if not self._flush_pending():
                    await armed.wait()
                self._flush_idle = False
            self.flush_wakeups += 1
            await asyncio.sleep(interval)
            self._flush_events(hold=True)
            if self.objects.decrements:
                freed = self.objects.drain()
                if freed:
                    self._release(freed)
            if self._lineage_drops:
                self.drop_deferred_lineage()
            if self._pin_changes:
                self._flush_pins()  # unpins no free took along (objects.py)
            if self.executor is not None:
                self.executor.flush_output()

    def _flush_events(self, hold: bool = False) -> None:
        """Send the buffered task events to the GCS, one row per task attempt (its later
        states ride along in ``more``: a no-op call's SUBMITTED, SCHEDULED, RUNNING and
        FINISHED are one row, not four).

        ``hold`` (the flush loop): a row of buffered events whose task has not ended yet
        waits for the next flush (once), where it has most often ended: a short task's
        whole attempt then goes as one packed row (``_pack_whole_attempts``), not as two
        rows (an async burst sent 1.6 rows per task without the hold, 1.03 with it). A
        long task shows in ``list_tasks`` as before, which flushes everything first; a
        poller sees it one interval later (a task submitted here: ``task_event_hold_ms``
        later, below).

        A task submitted here (``PendingTask.ev_live``) has no buffered events until it
        ends (``_pack_ended``) or a flush reports it: the loop's flushes leave it for
        ``task_event_hold_ms`` (``_report_fresh``); the next one, or any other flush,
        reports it (``spill_events``)."""
        if not hold:
            self.report_metrics()
        if self._fresh:
            self._report_fresh(hold)
        held = self._held_events
        ended = self._packed_rows
        if (not self._events and not self._running_events and not held and not ended) or self.gcs is None \
                or self.gcs.is_closed:
            return
        self._packed_rows = []
        raw, self._events = self._events, []
        running = self._running_events
        while running:  # (popitem: a task starting meanwhile is kept for the next flush)
            raw.append(running.popitem()[1])
        self._held_events = {}
        rows = list(held.values())
        kept = len(rows)
        _merge_events(raw, rows, held)
        if hold and len(rows) > kept:
            later = self._held_events
            send = rows[:kept]
            # (``held`` has every row's key, in ``rows``'s order: ``_merge_events`` adds both.)
            for key, row in itertools.islice(held.items(), kept, None):
                more = row[8]
                if row[2] is _SUBMITTED and (more is None or more[-1][0] not in _ENDED):
                    later[key] = row
                else:
                    send.append(row)
            rows = send
        plain, packed = _pack_whole_attempts(rows) if rows else ([], [])
        if plain or packed or ended:
            self.gcs.notify(m.AddTaskEvents(self.job_id, plain, ended + packed))

    def _report_fresh(self, hold: bool) -> None:
        """The flush: tasks submitted here and not ended, whose events ride on them, are
        reported (``spill_events``), or, with ``hold`` (the flush loop's), left for a later
        flush until ``_event_holds`` flushes have left them (``task_event_hold_ms``).

        Left for one flush only (as it was), a burst longer than two flushes (an async
        one of 20,000 calls takes ~1 s here) had most of its calls reported before
        their end: two plain rows each, which the GCS applies field by field, against one
        packed row it keeps as it came. Held for 400 ms: 20,000-task bursts of no-op tasks
        15.7-18.3k -> 17.2-20.9k/s (three alternating pairs), the GCS's CPU per task 12-19
        -> 7-12 us, the driver's 42-48 -> 39-45 us."""
        with self._fresh_lock:
            fresh, self._fresh = self._fresh, {}
        keep: dict[bytes, PendingTask] = {}
        holds = self._event_holds if hold else 0
        for tid, task in fresh.items():
            if not task.ev_live:
                continue  # (ended while a user thread added it)
            if task.ev_held < holds:
                task.ev_held += 1
                keep[tid] = task
            else:
                self.spill_events(task)
        if keep:
            with self._fresh_lock:
                keep.update(self._fresh)
                self._fresh = keep

    # ------------------------------------------------------------------ cancel

    def cancel(self, ref: ObjectRef, force: bool, recursive: bool) -> None:
        task_id = ref._id[:16]
        if force and self.run_sync(self._running_kind(task_id), 30.0) == m.TaskKind.ACTOR_TASK:
            raise ValueError("force=True is not supported for actor calls (it would kill the actor); "
                             "use lumos.kill(actor) to end the actor")
        self._post(self._cancel, task_id, force, recursive)

    async def _running_kind(self, task_id: TaskID) -> m.TaskKind | None:
        """The kind of this process's unfinished task ``task_id`` (None: none such); io thread.
        A call a user thread wrote itself is booked first."""
        self.io.drain_pending()
        task = self.tasks.get(task_id)
        return task.spec.kind if task is not None and task.state != DONE else None

    def _cancel(self, task_id: TaskID, force: bool, recursive: bool) -> None:
        task = self.tasks.get(task_id)
        if task is None or task.state == DONE:
            return
        task.cancelled = True
        if task.state in (WAITING_ARGS, QUEUED):
            self._fail_task(task, exc.TaskCancelledError(task_id.hex(), "cancelled before it started"))
            return
        if task.spec.kind == m.TaskKind.ACTOR_TASK:
            conn = self.actor_submitter.connection_of(task.spec.actor_id or b"")
            if conn is not None and not force:
                conn.notify(m.CancelTask(task_id, False, recursive))
            return
        lease = task.lease
        if lease is None or lease.conn is None:
            return
        if force:
            task.force_cancelled = True
            lease.raylet.notify(m.KillWorker(lease.worker_id, f"force-cancelled task {task.spec.name}",
                                             exit_type=m.WorkerExitType.INTENDED_USER_EXIT))
        else:
            lease.conn.notify(m.CancelTask(task_id, False, recursive))

    def cancel_children(self, parent_task_id: TaskID, force: bool) -> None:
        """Cancel every task this process submitted from ``parent_task_id`` (io thread)."""
        for task in list(self.tasks.values()):
            if task.spec.parent_task_id == parent_task_id:
                self._cancel(task.spec.task_id, force, True)


_SUBMITTED = m.TaskState.SUBMITTED
_ENDED = frozenset((m.TaskState.FINISHED, m.TaskState.FAILED, m.TaskState.CANCELLED))


def flushes_held(hold_ms: int, interval_ms: int) -> int:
    """Flushes of the flush loop a fresh task not ended is left for: enough to span
    ``hold_ms`` (``task_event_hold_ms``) at one every ``interval_ms``."""
    return -(-hold_ms // interval_ms) if hold_ms > 0 else 0


def _pack_whole_attempts(rows: list[list[Any]]) -> tuple[list[list[Any]], list[list[Any]]]:
    """``rows`` split for ``m.AddTaskEvents``: those of a whole attempt (SUBMITTED with
    the task's facts ... its end) packed, ``[task_id, attempt, end_state, packed row]``,
    which the GCS keeps as bytes, and the rest as they are. (A packer per call: one per
    flush, never shared between threads.)"""
    plain: list[list[Any]] = []
    packed: list[list[Any]] = []
    packer = msgpack.Packer(use_bin_type=True, autoreset=True)
    for row in rows:
        more = row[8]
        if row[2] is _SUBMITTED and more and row[4] and (end := more[-1][0]) in _ENDED:
            try:
                packed.append([row[0], row[1], end, packer.pack(row)])
                continue
            except (TypeError, ValueError, OverflowError):  # (a value msgpack cannot take: sent plain)
                packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        plain.append(row)
    return plain, packed


def _merge_events(raw: list[tuple[Any, ...]], rows: list[list[Any]], by_task: dict[Any, list[Any]]) -> None:
    """Fold buffered task events into ``rows`` for ``m.AddTaskEvents``, one row per task
    attempt (``by_task`` finds it: rows held from the last flush are in both).
    Row: [task_id, attempt, state, time, info, node_id, worker_id, error, more]."""
    find = by_task.get
    for ev in raw:
        # (A first attempt, nearly every task, is keyed by its id alone: no key tuple.)
        key = ev[0] if not ev[1] else (ev[0], ev[1])
        row = find(key)
        if row is None:
            # (A 9th field is a later state and its time: a finished task's RUNNING and
            # end come in one buffered row, ``ResultsMixin._task_done``.)
            row = by_task[key] = [*ev, None] if len(ev) == 8 else [*ev[:8], [list(ev[8])]]
            rows.append(row)
            continue
        state, t, info, node, worker, err = ev[2:8]
        more = row[8]
        if more is None:
            row[8] = more = [[state, t]]
        else:
            more.append([state, t])
        if len(ev) > 8:
            more.append(list(ev[8]))
        if info:
            row[4] = {**row[4], **info} if row[4] else info
        if node:
            row[5] = node
        if worker:
            row[6] = worker
        if err:
            row[7] = err


def _parameter_names(template: TaskTemplate) -> list[str]:
    """Positional parameter names of a task's function or an actor's ``__init__`` (for
    error messages; empty when they cannot be known here, as for actor methods)."""
    import inspect
    if template.pickled_function is None:
        return []
    try:
        fn = ser.deserialize_code(template.pickled_function)
        if template.kind == m.TaskKind.ACTOR_CREATION_TASK:
            names = list(inspect.signature(fn.__init__).parameters)[1:]
        else:
            names = list(inspect.signature(fn).parameters)
    except (ValueError, TypeError, ser.DeserializationError):
        return []
    return names
