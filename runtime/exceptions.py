"""Errors a lumos user can meet.

Every error derives from ``LumosError`` and keeps Ray's name available
(``RayTaskError``, ``RayActorError``, ...). Every one pickles to an equal message,
so errors cross processes intact. A task's exception reaches ``get`` as a
``TaskError`` that is also an instance of the user's exception class and carries the
remote traceback.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "LumosError", "RayError", "TaskError", "RayTaskError", "GetTimeoutError",
    "WorkerCrashedError", "TaskCancelledError", "ObjectLostError", "OwnerDiedError",
    "ObjectFreedError", "ObjectReconstructionFailedError", "ActorDiedError", "RayActorError",
    "ActorUnavailableError", "ObjectStoreFullError", "OutOfDiskError", "OutOfMemoryError", "NodeDiedError",
    "LumosSystemError", "RaySystemError", "TaskUnschedulableError", "ActorUnschedulableError",
    "LocalRayletDiedError", "PendingCallsLimitExceeded", "TaskPlacementGroupRemoved",
    "ActorPlacementGroupRemoved", "CrossLanguageError", "RuntimeEnvSetupError",
    "ClusterUnavailableError",
]


class LumosError(Exception):
    """Base of every lumos error."""

    def __reduce__(self) -> Any:
        return (type(self), self.args)


RayError = LumosError


class WrongArgumentError(TypeError, ValueError):
    """An argument of the wrong kind (``get(5)``, ``kill(ref)``): a TypeError, and a
    ValueError too, which Ray raises for these, so code written for either catches it."""


class LumosSystemError(LumosError):
    """lumos itself failed (a bug or a broken installation), not the user's code."""


RaySystemError = LumosSystemError


def _cause_text(cause: BaseException) -> str:
    """``Type: message`` of an exception whose ``__str__`` may itself raise."""
    try:
        text = str(cause)
    except Exception as e:
        text = f"<str() of the exception failed: {type(e).__name__}>"
    return f"{type(cause).__name__}: {text}"


class TaskError(LumosError):
    """A task or actor method raised. ``cause`` is the original exception.

    ``get`` raises ``as_instanceof_cause()``: an object that is both a ``TaskError`` and
    an instance of the cause's class, so ``except ValueError`` still catches it.
    """

    def __init__(self, function_name: str, traceback_str: str, cause: BaseException | None = None,
                 cause_repr: str = "", pid: int = 0, node_ip: str = "", task_id_hex: str = "") -> None:
        self.function_name = function_name
        self.traceback_str = traceback_str
        self.cause = cause
        self.cause_repr = cause_repr or (_cause_text(cause) if cause is not None else "")
        self.pid = pid
        self.node_ip = node_ip
        self.task_id_hex = task_id_hex
        super().__init__(function_name, traceback_str, cause, self.cause_repr, pid, node_ip, task_id_hex)

    def __reduce__(self) -> Any:
        return (_rebuild_task_error, (self.function_name, self.traceback_str, _CauseBox(self.cause),
                                      self.cause_repr, self.pid, self.node_ip, self.task_id_hex))

    def __str__(self) -> str:
        where = f" (pid={self.pid}, ip={self.node_ip})" if self.pid else ""
        return f"lumos::{self.function_name}(){where}\n{self.traceback_str.rstrip()}"

    def as_instanceof_cause(self) -> "TaskError":
        """This error as an instance of both ``TaskError`` and the cause's class."""
        cause = self.cause
        if cause is None:
            return self
        cls = type(cause)
        while issubclass(cls, TaskError):  # a nested task's error: use the user's class inside
            inner = getattr(cause, "cause", None)
            if inner is None:
                return self
            cause, cls = inner, type(inner)
        dual = _dual_class(cls)
        if dual is None:
            return self
        try:
            err = dual.__new__(dual)
        except TypeError:
            # MemoryError's own __new__ refuses subclasses whose first base is not its own
            # line; its layout is plain BaseException's, so that constructor is safe.
            err = Exception.__new__(dual)
        err.__dict__.update(self.__dict__)
        err.args = (cause,)  # as Ray's: e.args[0] is the original exception; str(e) stays the traceback
        return err

    def _render_traceback_(self) -> list[str]:
        """IPython shows only the remote frames, with the cell's own line numbers."""
        return [f"{type(self).__name__}: lumos::{self.function_name}()"
                + (f" (pid={self.pid}, ip={self.node_ip})" if self.pid else ""),
                self.traceback_str.rstrip()]

    def _repr_html_(self) -> str:
        """Notebook display: the task, where it ran, and the remote traceback."""
        from html import escape
        where = f" (pid={self.pid}, ip={escape(self.node_ip)})" if self.pid else ""
        return (f"<div class='lumos-task-error'><b style='color:#cf222e'>{escape(type(self).__name__)}</b>: "
                f"task <code>{escape(self.function_name)}</code>{where} failed"
                f"<pre style='background:#fff5f5;border-left:3px solid #cf222e;padding:4px 6px;"
                f"white-space:pre-wrap'>{escape(self.traceback_str.rstrip())}</pre></div>")


RayTaskError = TaskError


class _CauseBox:
    """A task error's cause, pickled on its own: a cause that cannot be rebuilt where the
    error is read (its ``__init__`` wants other arguments than its ``args``, or its class
    does not load there) leaves the error without a cause, keeping its message and
    traceback text, as Ray does, instead of making the whole error unreadable."""

    __slots__ = ("cause",)

    def __init__(self, cause: BaseException | None) -> None:
        self.cause = cause

    def __reduce__(self) -> Any:
        if self.cause is None:
            return (_load_cause, (None,))
        from lumos._private.serialization import cloudpickle_dumps
        return (_load_cause, (cloudpickle_dumps(self.cause, protocol=5),))


def _load_cause(blob: bytes | None) -> BaseException | None:
    if blob is None:
        return None
    import pickle
    try:
        cause = pickle.loads(blob)
    except Exception:  # its class cannot be rebuilt here: the message and traceback text stay
        return None
    return cause if isinstance(cause, BaseException) else None


def _rebuild_task_error(function_name: str, traceback_str: str, cause: Any, cause_repr: str, pid: int,
                        node_ip: str, task_id_hex: str) -> "TaskError":
    if isinstance(cause, _CauseBox):
        cause = cause.cause
    return TaskError(function_name, traceback_str, cause, cause_repr, pid, node_ip, task_id_hex)

_dual_cache: dict[type, type | None] = {}


def _dual_class(cause_cls: type) -> type | None:
    if cause_cls in _dual_cache:
        return _dual_cache[cause_cls]
    try:
        def __init__(self: Any, *args: Any) -> None:  # never called by lumos; user code may
            Exception.__init__(self, *args)

        def __getattr__(self: Any, name: str) -> Any:
            cause = self.__dict__.get("cause")
            if cause is None or name.startswith("__"):
                raise AttributeError(name)
            return getattr(cause, name)

        def __reduce__(self: Any) -> Any:
            return (_rebuild_dual, (TaskError(self.function_name, self.traceback_str, self.cause,
                                              self.cause_repr, self.pid, self.node_ip,
                                              self.task_id_hex),))

        dual = type(f"TaskError({cause_cls.__name__})", (TaskError, cause_cls), {
            "__init__": __init__, "__getattr__": __getattr__, "__reduce__": __reduce__,
            "__str__": TaskError.__str__, "__module__": "lumos.exceptions",
        })
    except TypeError:  # layout conflicts, final classes
        dual = None
    _dual_cache[cause_cls] = dual
    return dual


def _rebuild_dual(err: TaskError) -> TaskError:
    return err.as_instanceof_cause()


class GetTimeoutError(LumosError, TimeoutError):
    """``get`` or ``wait`` ran out of time before the values were ready."""


class WorkerCrashedError(LumosError):
    """The worker process running a task died (and retries, if any, were used up)."""


class NodeDiedError(WorkerCrashedError):
    """The node running a task died, and its retries, if any, were used up (a
    WorkerCrashedError too: the task's worker died with its node)."""


class TaskCancelledError(LumosError):
    """The task was cancelled with ``lumos.cancel``."""

    def __init__(self, task_id_hex: str = "", detail: str = "") -> None:
        self.task_id_hex = task_id_hex
        self.detail = detail
        super().__init__(task_id_hex, detail)

    @property
    def task_id(self) -> Any:
        """The cancelled task's id (Ray's ``TaskCancelledError.task_id``), or None."""
        from lumos.object_ref import TaskIDView
        try:
            return TaskIDView(bytes.fromhex(self.task_id_hex)) if self.task_id_hex else None
        except ValueError:
            return None

    def __str__(self) -> str:
        return f"task {self.task_id_hex[:16]} was cancelled" + (f": {self.detail}" if self.detail else "")


class ObjectLostError(LumosError):
    """An object's value is gone and cannot be rebuilt."""

    def __init__(self, object_id_hex: str = "", detail: str = "") -> None:
        self.object_id_hex = object_id_hex
        self.detail = detail
        super().__init__(object_id_hex, detail)

    def __str__(self) -> str:
        return f"object {self.object_id_hex[:16]} is lost" + (f": {self.detail}" if self.detail else "")


class OwnerDiedError(ObjectLostError):
    """The process that owned the object (submitted its task or called put) died."""

    def __str__(self) -> str:
        return (f"object {self.object_id_hex[:16]} is lost because its owner died"
                + (f": {self.detail}" if self.detail else ""))


class ObjectFreedError(ObjectLostError):
    """The object was freed (its last reference went away) before this read."""


class ObjectReconstructionFailedError(ObjectLostError):
    """The object was lost and re-running its lineage failed."""


class _ActorError(LumosError):
    """What an actor's error carries: the actor, what happened, and (an ``__init__`` that
    raised) the cause."""

    def __init__(self, actor_id_hex: str = "", detail: str = "", cause: BaseException | None = None) -> None:
        self.actor_id_hex = actor_id_hex
        self.detail = detail
        self.cause = cause
        super().__init__(actor_id_hex, detail, cause)

    def __str__(self) -> str:
        return f"actor {self.actor_id_hex[:16]}: {self.detail}"

    @property
    def actor_id(self) -> str:
        """(Ray's name) The actor's id, in hex."""
        return self.actor_id_hex


class RayActorError(_ActorError):
    """An actor could not answer a call: it is dead for good (``ActorDiedError``) or, for
    now, being restarted (``ActorUnavailableError``). As in Ray, the two are siblings:
    ``except ActorDiedError`` does not catch a restart in progress."""

    # Ray's attribute names.

    @property
    def error_msg(self) -> str:
        return str(self)

    @property
    def actor_init_failed(self) -> bool:
        """The actor's ``__init__`` raised (``cause`` is that error)."""
        return self.cause is not None

    @property
    def preempted(self) -> bool:
        """(Ray: its node was preempted; lumos does not tell that apart.)"""
        return False


class ActorDiedError(RayActorError):
    """The actor is dead: killed, crashed beyond ``max_restarts``, or its ``__init__`` failed."""

    def __str__(self) -> str:
        return f"actor {self.actor_id_hex[:16]} died: {self.detail}"


class ActorExitRequest(SystemExit):
    """Raised by ``lumos.actor.exit_actor()``: ends the actor on purpose (no restart)."""


class ActorUnavailableError(RayActorError):
    """The actor's process failed while a call was on its way or running, and the actor is
    being restarted: the call was not retried (``max_task_retries``) and may or may not
    have run; later calls reach the restarted actor. Not an ``ActorDiedError``, as in Ray."""

    def __str__(self) -> str:
        return f"actor {self.actor_id_hex[:16]} is unavailable: {self.detail}"


class ActorUnschedulableError(_ActorError):
    """No node can ever host the actor (``NodeAffinitySchedulingStrategy(soft=False)`` to a
    node that is gone or too small): its calls raise this. As in Ray, not a
    ``RayActorError``."""


class TaskUnschedulableError(LumosError):
    """No node can run the task."""


class ObjectStoreFullError(LumosError, MemoryError):
    """The node's object store has no room for a new object."""


class OutOfMemoryError(LumosError, MemoryError):
    """A worker was killed because its node ran out of memory."""


class LocalRayletDiedError(LumosError):
    """This process's raylet died."""


class PendingCallsLimitExceeded(LumosError):
    """An actor has more pending calls than ``max_pending_calls``."""


class TaskPlacementGroupRemoved(LumosError):
    """The task's placement group was removed."""


class ActorPlacementGroupRemoved(LumosError):
    """The actor's placement group was removed."""


class CrossLanguageError(LumosError):
    """Kept for Ray compatibility; lumos is Python only."""


class RuntimeEnvSetupError(LumosError):
    """A runtime environment could not be set up."""


class ClusterUnavailableError(LumosSystemError, ConnectionError):
    """The cluster cannot be reached: the connection to the GCS or to this node's raylet
    was lost (the cluster stopped, or its head node died). Calls fail with it at once
    rather than wait; ``lumos.shutdown()`` and ``lumos.init()`` start over."""


# Ray's other public errors: defined so that ``except ray.exceptions.X`` works unchanged.
# lumos raises the ones whose docstring says when; the others name Ray features lumos
# does not have (compiled graphs, tensor transport, Ray Client), and are never raised.


class ActorAlreadyExistsError(LumosError, ValueError):
    """A named actor with this name already exists in its namespace: raised by creating
    another (create with ``get_if_exists=True`` to get it instead). A ``ValueError``."""


class ActorHandleNotFoundError(LumosError):
    """Kept for Ray compatibility; never raised by lumos."""


class AsyncioActorExit(LumosError):
    """Kept for Ray compatibility: lumos ends an async actor with ``exit_actor()`` too."""


class AuthenticationError(LumosError, ConnectionError):
    """Kept for Ray compatibility: lumos reports a wrong cluster token as a
    ``ConnectionError`` saying so."""


class ObjectFetchTimedOutError(ObjectLostError):
    """Kept for Ray compatibility; lumos raises ``ObjectLostError`` when a pull fails."""


class ObjectRefStreamEndOfStreamError(LumosError):
    """Kept for Ray compatibility; lumos's generators raise ``StopIteration`` at the end."""


class OufOfBandObjectRefSerializationException(LumosError):
    """Kept for Ray compatibility (Ray's spelling); lumos allows pickling refs out of band."""


class OutOfDiskError(ObjectStoreFullError):
    """The object store is full and its node's spill directory has no room to spill to
    (an ``ObjectStoreFullError`` too, so code that catches that keeps working)."""


class PlasmaObjectNotAvailable(LumosError):
    """Kept for Ray compatibility; never raised by lumos."""


class RayCgraphCapacityExceeded(LumosError):
    """Ray compiled graphs are not part of lumos; never raised."""


class RayChannelError(LumosError):
    """Ray compiled-graph channels are not part of lumos; never raised."""


class RayChannelTimeoutError(RayChannelError, TimeoutError):
    """Ray compiled-graph channels are not part of lumos; never raised."""


class RayDirectTransportError(LumosError):
    """Ray's GPU tensor transport is not part of lumos; never raised."""


class ReferenceCountingAssertionError(ObjectLostError):
    """Kept for Ray compatibility; lumos raises ``ObjectFreedError`` for a freed object."""


class RpcError(LumosError):
    """Kept for Ray compatibility; lumos reports lost connections as ``LumosSystemError``."""


class StreamingGeneratorReplayInconsistentError(LumosError):
    """Kept for Ray compatibility; never raised by lumos."""


class UnserializableException(LumosError):
    """Kept for Ray compatibility: a task exception lumos cannot send or rebuild arrives
    as a ``TaskError`` that keeps its message and traceback text."""


class UserCodeException(LumosError):
    """Kept for Ray compatibility; lumos wraps user errors in ``TaskError``."""
