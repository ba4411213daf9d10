"""What this process owns: its objects, their references, and the lineage to rebuild them (pure).

``OwnerState`` decides; ``CoreWorker`` (io thread) feeds it what happened and runs the
actions it returns. It holds the object table (``references.ObjectTable``: values,
local/submitted/contained counts, borrowers), the **lineage** (finished tasks whose
stored values are still referenced, so they can run again), and the nodes the GCS
declared dead. Its decisions: when a task's arguments are ready (or lost, or failed),
which lineage to keep or drop, and how to rebuild a lost value (its task again, after
the arguments that were lost with it).

```
 CoreWorker (io thread)                         OwnerState
 task with ref args ─── resolve_args(task) ───► wait on pending entries ─► FetchObject (borrowed)
 an argument ready ──── arg_ready(task) ──────► all ready? values into the spec ─► EnqueueTask
                                                an argument failed ─► FailTaskWithValue
                                                stored on a dead node ─► RunAgain(its task) first
 task finished ──────── keep_lineage(task) ───► lineage (bounded by lineage_max_bytes)
 returns freed ──────── drop_lineage(ids) ────► tasks whose arguments can go now
 value lost with node ─ reconstruct(oid, node) ► RunAgain(arguments' tasks..., its task) | why not
```

The table itself keeps its reentrant lock, and that is deliberate: user threads read and
write it without a hop to the io thread (``put`` records an owned value, ``get``/``wait``
check states and register their waiters, deserialized refs count themselves,
``drain_refs`` folds in dropped refs at API entry). Routing those through the io thread
would add a thread hop to every ``put`` and every ready ``get``. Everything else here —
lineage, dead nodes, argument resolution, reconstruction — is touched by the io thread
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Container, Iterable, Union

from lumos import exceptions as exc
from lumos._private.core_worker.objects import error_blob
from lumos._private.core_worker.references import (FAILED, PENDING, READY, Freed, ObjectEntry, ObjectTable,
                                                   holds_error)
from lumos._private.core_worker.tasks import DONE, WAITING_ARGS, PendingTask
from lumos._private.ids import NodeID, ObjectID, TASK_ID_SIZE, WorkerID, is_put_object, short, task_id_of
from lumos._private.protocol import messages as m

#: Argument bytes of the lineage one process keeps; tasks beyond it cannot be rebuilt.
LINEAGE_MAX_BYTES = 256 * 1024 * 1024


def lineage_size(task: PendingTask) -> int:
    """What keeping ``task`` for lineage costs against ``LINEAGE_MAX_BYTES``."""
    return len(task.spec.args) + 512


def stored_on(e: ObjectEntry | None, nodes: Container[bytes]) -> bool:
    """``e`` is an owned, ready value whose only copy is in the store of one of ``nodes``."""
    return (e is not None and e.owned and e.state == READY and e.data is None
            and e.node_id is not None and e.node_id in nodes)


# ---------------------------------------------------------------------------- actions

@dataclass(slots=True)
class EnqueueTask:
    """Every argument of ``task`` is ready (values copied into its spec): schedule it."""
    task: PendingTask


@dataclass(slots=True)
class FetchObject:
    """Ask the owner of borrowed ``object_id`` for its value (a long poll)."""
    object_id: ObjectID
    owner: m.Address


@dataclass(slots=True)
class FailTask:
    task: PendingTask
    error: BaseException


@dataclass(slots=True)
class FailTaskWithValue:
    """An argument is an error value: the task's results are that error."""
    task: PendingTask
    blob: bytes


@dataclass(slots=True)
class RunAgain:
    """Start a new attempt of finished ``task`` (lineage reconstruction): its returns are
    pending again; resolve its arguments and schedule it."""
    task: PendingTask
    why: str


Action = Union[EnqueueTask, FetchObject, FailTask, FailTaskWithValue, RunAgain]


class OwnerState:
    """Objects, references, lineage and the reconstruction decisions of one process."""

    def __init__(self, worker_id: WorkerID, *, lineage_max_bytes: int = LINEAGE_MAX_BYTES,
                 validate: bool = False) -> None:
        #: Values, counts and borrowers (shared with user threads under its lock, see above).
        self.objects = ObjectTable(worker_id)
        #: Finished normal tasks whose values in an object store are still referenced, by
        #: task id: enough to run such a task again when its node dies with the value (its
        #: arguments stay pinned while it is kept).
        self.lineage: dict[bytes, PendingTask] = {}
        #: ``lineage_size`` summed over ``lineage``.
        self.lineage_bytes = 0
        self.lineage_max_bytes = lineage_max_bytes
        #: Nodes the GCS declared dead: values stored there are lost.
        self.dead_nodes: set[bytes] = set()
        #: Check the entries an event touched, and the lineage's accounting (tests).
        self.check = validate
        #: Called on the io thread when an argument a task waits for becomes ready (the
        #: core worker passes it on to ``arg_ready``); entries keep it as a callback.
        self.on_arg_ready: Callable[[PendingTask], None] = lambda task: None

    # ------------------------------------------------------------------ arguments

    def resolve_args(self, task: PendingTask) -> list[Action]:
        """``task`` takes refs as arguments: wait for those not ready (fetching borrowed
        ones from their owners); when none is pending, decide at once (``args_ready``)."""
        task.state = WAITING_ARGS
        waiting = 0
        objects = self.objects
        entries = objects.entries
        out: list[Action] = []
        for dep in task.spec.deps:
            e = entries.get(dep.object_id)
            if e is None:
                return [FailTask(task, _freed_arg(dep))]
            with objects.lock:
                if e.state == PENDING:
                    waiting += 1
                    if e.callbacks is None:
                        e.callbacks = []
                    e.callbacks.append(lambda entry, t=task: self.on_arg_ready(t))
                    if not e.owned and not e.fetching and e.owner is not None:
                        e.fetching = True
                        out.append(FetchObject(dep.object_id, e.owner))
        task.deps_waiting = waiting
        if waiting == 0:
            out.extend(self.args_ready(task))
        return out

    def arg_ready(self, task: PendingTask) -> list[Action]:
        """One argument ``task`` waited for is ready."""
        task.deps_waiting -= 1
        if task.deps_waiting == 0 and task.state == WAITING_ARGS:
            return self.args_ready(task)
        return []

    def args_ready(self, task: PendingTask) -> list[Action]:
        """No argument of ``task`` is pending: copy their values (or locations) into its
        spec, or fail it with an argument's error, or first rebuild arguments that died
        with their node."""
        if task.cancelled:
            return []
        entries = self.objects.entries
        if self.dead_nodes:
            lost = [(d.object_id, entries[d.object_id].node_id) for d in task.spec.deps
                    if stored_on(entries.get(d.object_id), self.dead_nodes)]
            if lost:
                return self._rebuild_lost_args(task, lost)
        for dep in task.spec.deps:
            e = entries.get(dep.object_id)
            if e is None:
                return [FailTask(task, _freed_arg(dep))]
            if holds_error(e):
                e.seen = True  # (the error goes on in the dependent task's results)
                return [FailTaskWithValue(task, e.data or error_blob(exc.ObjectLostError(dep.object_id.hex())))]
            dep.data = e.data
            dep.node_id = e.node_id
            dep.slot = e.lent
            if e.owned:
                e.shared = True
        if self.check:
            self._check_entries(task.dep_ids)
        return [EnqueueTask(task)]

    def _rebuild_lost_args(self, task: PendingTask, lost: list[tuple[bytes, bytes | None]]) -> list[Action]:
        """Arguments owned here whose only copy died with its node are rebuilt from their
        lineage before ``task`` runs; it then waits for them again."""
        out: list[Action] = []
        for oid, node in lost:
            why = self._reconstruct(oid, node, out)
            if why is not None:
                out.append(FailTask(task, exc.ObjectLostError(
                    oid.hex(), f"an argument of {task.spec.name} was lost with node {short(node or b'')}, "
                    f"and it cannot be rebuilt: {why}")))
                return out
        out.extend(self.resolve_args(task))  # they are pending again: wait for the new values
        return out

    # ------------------------------------------------------------------ lineage

    def keep_lineage(self, task: PendingTask) -> None:
        """Keep a finished task that can run again while its stored values are referenced
        (inline values live here: nothing to rebuild)."""
        entries = self.objects.entries
        for oid in task.return_ids:
            e = entries.get(oid)
            if e is not None and e.data is None and e.node_id is not None:
                break
        else:
            return
        size = lineage_size(task)
        if self.lineage_bytes + size > self.lineage_max_bytes:
            return
        self.lineage[task.spec.task_id] = task
        self.lineage_bytes += size

    def lineage_hit(self, freed: Iterable[Freed]) -> list[bytes]:
        """Task ids in the lineage whose returns are among ``freed`` (any thread: a racy
        read of the lineage is fine, ``drop_lineage`` checks again on the io thread)."""
        lineage = self.lineage
        if not lineage:
            return []
        return [f.object_id[:TASK_ID_SIZE] for f in freed
                if f.entry.owned and f.object_id[:TASK_ID_SIZE] in lineage]

    def drop_lineage(self, task_ids: Iterable[bytes]) -> list[PendingTask]:
        """Returns of these tasks were freed: once none is left, forget the task. Returns
        the tasks forgotten (their arguments can go now)."""
        entries = self.objects.entries
        dropped = []
        for tid in task_ids:
            task = self.lineage.get(tid)
            if task is None or any(oid in entries for oid in task.return_ids):
                continue
            del self.lineage[tid]
            self.lineage_bytes -= lineage_size(task)
            dropped.append(task)
        if self.check:
            self._check_lineage()
        return dropped

    def pins_args(self, task: PendingTask) -> bool:
        """``task``'s arguments stay pinned: it is kept to run again."""
        return task.spec.task_id in self.lineage

    def node_died(self, node_id: NodeID) -> bool:
        """The GCS declared ``node_id`` dead. False when it was known already."""
        if node_id in self.dead_nodes:
            return False
        self.dead_nodes.add(node_id)
        return True

    def reconstruct(self, oid: ObjectID, lost_node: bytes | None) -> tuple[str | None, list[Action]]:
        """Run again the task that made ``oid`` (owned here), lost with node ``lost_node``.

        Returns ``(None, actions)`` once the new run is decided (or already under way),
        else ``(why it cannot, actions)``; the actions start the runs decided on the way
        (arguments of the task that were lost on the same node are rebuilt first) and
        are to be carried out either way.
        """
        out: list[Action] = []
        why = self._reconstruct(oid, lost_node, out)
        if self.check:
            self._check_lineage()
        return why, out

    def _reconstruct(self, oid: ObjectID, lost_node: bytes | None, out: list[Action]) -> str | None:
        entries = self.objects.entries
        e = entries.get(oid)
        if e is None:
            return "no reference to it is held here"
        if e.state == PENDING:
            return None  # already being rebuilt
        if lost_node is not None and e.state == READY and e.node_id not in (None, lost_node) \
                and e.node_id not in self.dead_nodes:
            return None  # it lives in a copy on another node now (``copies.py``)
        tid = task_id_of(oid)
        task = self.lineage.get(tid)
        if task is None:
            if is_put_object(oid):
                return "it was stored with put(), which has no lineage"
            return ("the task that made it cannot run again (max_retries=0, retries used up, or "
                    "its lineage was not kept)")
        for dep_id in task.dep_ids:
            if lost_node is not None and stored_on(entries.get(dep_id), (lost_node,)):
                why = self._reconstruct(dep_id, lost_node, out)
                if why is not None:
                    return f"its argument {short(dep_id)} was lost too and {why}"
        del self.lineage[tid]
        self.lineage_bytes -= lineage_size(task)
        if task.retries_left > 0:
            task.retries_left -= 1
        for rid in task.return_ids:
            self.objects.reset_pending(rid)
        task.cancelled = task.force_cancelled = False
        out.append(RunAgain(task, f"lineage reconstruction: its value was lost with node {short(lost_node or b'')}"))
        return None

    # ------------------------------------------------------------------ invariants

    def validate(self) -> None:
        """Check every invariant; raise ``AssertionError`` naming the first one broken."""
        with self.objects.lock:
            self._check_entries(list(self.objects.entries))
        self._check_lineage()

    def _check_entries(self, ids: Iterable[bytes]) -> None:
        entries = self.objects.entries
        with self.objects.lock:
            for oid in ids:
                e = entries.get(oid)
                if e is None:
                    continue
                what = f"object {short(oid)}"
                _check(e.local >= 0 and e.submitted >= 0 and e.contained >= 0,
                       f"{what}: negative count (local {e.local}, submitted {e.submitted}, "
                       f"contained {e.contained})")
                _check(e.alive(), f"{what}: held by nothing but still in the table")
                _check(e.owned == (e.owner is None), f"{what}: owned={e.owned} but owner={e.owner}")
                _check(not e.borrowers or e.owned, f"{what}: borrowers on a borrowed object")
                for wid in e.borrowers or ():
                    _check(oid in self.objects.lent.get(wid, ()), f"{what}: borrower {short(wid)} not indexed")
                _check(e.state in (PENDING, READY, FAILED), f"{what}: state {e.state}")
                if e.state == READY:
                    _check(e.data is not None or e.node_id is not None, f"{what}: ready with no value")
                elif e.state == FAILED:
                    _check(e.data is not None, f"{what}: failed with no error value")
                else:
                    _check(e.data is None and e.node_id is None, f"{what}: pending with a value")

    def _check_lineage(self) -> None:
        total = 0
        for tid, task in self.lineage.items():
            _check(task.spec.task_id == tid, f"lineage task {short(tid)} filed under another id")
            _check(task.state == DONE, f"lineage task {short(tid)} is not finished (state {task.state})")
            total += lineage_size(task)
        _check(total == self.lineage_bytes, f"lineage bytes {self.lineage_bytes} != {total} kept")
        _check(total <= self.lineage_max_bytes, f"lineage of {total} bytes over {self.lineage_max_bytes}")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise AssertionError(f"OwnerState: {what}")


def _freed_arg(dep: m.Dep) -> exc.ObjectFreedError:
    """The error of a task whose argument ``dep`` this process holds no reference to."""
    from lumos._private import worker_context
    why = worker_context.earlier_session(dep.owner)
    return exc.ObjectFreedError(dep.object_id.hex(), f"an argument was freed: {why}" if why
                                else "an argument was freed")


__all__ = ["OwnerState", "LINEAGE_MAX_BYTES", "Action", "EnqueueTask", "FetchObject", "FailTask",
           "FailTaskWithValue", "RunAgain", "stored_on", "lineage_size"]
