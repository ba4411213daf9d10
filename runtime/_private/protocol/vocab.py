"""The closed sets of values that travel in messages: task kinds, retry policies, error
kinds, task states, object states and worker exit types.

Each is an ``IntEnum`` or ``StrEnum`` whose values are the wire values, so a member is
encoded as the plain int or string it stands for and compares equal to it. The codec
(``codec.py``) decodes a field annotated with one of these types into the member and
refuses any other value with a ``ProtocolError``, like any other ill-typed field.

Used by the core worker (specs, replies, events), the GCS task log, the state API and,
through ``lumos.state``, the dashboard.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum


class TaskKind(IntEnum):
    """What a ``TaskSpec`` runs. Names are Ray's task types (the task log's ``type``)."""

    NORMAL_TASK = 0
    ACTOR_CREATION_TASK = 1
    ACTOR_TASK = 2


class RetryPolicy(IntEnum):
    """Which exceptions of the user's code retry a task (``retry_exceptions``)."""

    NEVER = 0
    ANY_EXCEPTION = 1
    #: Only the classes pickled in ``TaskSpec.retry_exception_types``.
    LISTED_EXCEPTIONS = 2


class ErrorKind(StrEnum):
    """Why a ``TaskReply`` carries a system error instead of the task's returns."""

    #: Cancelled before it started or while it ran.
    CANCELLED = "cancelled"
    #: The actor is gone (or never came up); the call cannot run on it.
    ACTOR_DIED = "actor_died"
    #: The worker cannot take it now (blocked, or exiting after ``max_calls``): queue it again.
    REQUEUE = "requeue"
    #: The actor's worker is exiting on purpose (``exit_actor()``).
    EXITING = "exiting"


class PlacementGroupRemoved(ValueError):
    """A lease asked for a placement group that was removed (or never existed). Raised by
    the GCS and the raylets; its name crosses the wire (``RemoteError.type_name``), and
    the owner fails the task with ``TaskPlacementGroupRemoved``."""


class TaskUnschedulable(ValueError):
    """A lease's hard constraint can never be met: ``NodeAffinitySchedulingStrategy
    (soft=False)`` names a node that is gone or too small. Raised by the GCS and the
    raylets; its name crosses the wire, and the owner fails the task with
    ``TaskUnschedulableError``."""


#: The refusals of a lease request that cross the wire by name (``RemoteError.type_name``)
#: and end the owner's waiting tasks: name -> class. The raylet re-raises them from the
#: GCS's answer, the owner fails its tasks with the matching user error.
LEASE_REFUSALS: dict[str, type[ValueError]] = {c.__name__: c for c in (PlacementGroupRemoved, TaskUnschedulable)}


#: How the GCS begins the death cause of an actor no node can ever host (hard affinity to
#: a node that is gone or too small); its callers raise ``ActorUnschedulableError``.
ACTOR_UNSCHEDULABLE_CAUSE = "cannot be scheduled: "

#: Why a raylet stops the workers running in a removed placement group's bundles; the
#: owners of their tasks recognise it and raise ``TaskPlacementGroupRemoved``.
PG_REMOVED_STOP_REASON = "its placement group was removed"


class ActorNameTaken(ValueError):
    """A named actor's registration found the name taken in its namespace. Raised by the
    GCS; the creator raises ``ActorAlreadyExistsError`` (a ``ValueError``)."""


class TaskState(StrEnum):
    """A task attempt's state in the task-event log, in the order a task passes them."""

    SUBMITTED = "SUBMITTED"
    PENDING_ARGS = "PENDING_ARGS"
    SCHEDULED = "SCHEDULED"
    RUNNING = "RUNNING"
    RETRIED = "RETRIED"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


class WorkerExitType(StrEnum):
    """Why a worker process ended (Ray's ``exit_type`` of a worker row)."""

    #: It crashed, or was killed from outside lumos, or its node died.
    SYSTEM_ERROR = "SYSTEM_ERROR"
    #: lumos stopped it on purpose: idle, its job or actor ended, a shutdown.
    INTENDED_SYSTEM_EXIT = "INTENDED_SYSTEM_EXIT"
    #: The user's code failed where that ends the worker (an actor's ``__init__``).
    USER_ERROR = "USER_ERROR"
    #: The user ended it: ``kill``, ``exit_actor``, a forced ``cancel``, a driver's exit.
    INTENDED_USER_EXIT = "INTENDED_USER_EXIT"
    #: The node's memory monitor killed it.
    NODE_OUT_OF_MEMORY = "NODE_OUT_OF_MEMORY"


class ObjectState(IntEnum):
    """An owner's answer about one of its objects (``ObjectStatus.status``)."""

    PENDING = 0
    READY = 1
    #: Freed, or never known to the owner.
    FREED = 2
    #: Its value was lost with a node and cannot be rebuilt.
    LOST = 3


#: States after which an attempt changes no more.
TERMINAL_TASK_STATES = frozenset((TaskState.FINISHED, TaskState.FAILED, TaskState.CANCELLED))
#: States of a task that waits to run (a retried one waits for its next attempt).
PENDING_TASK_STATES = frozenset((TaskState.SUBMITTED, TaskState.PENDING_ARGS, TaskState.SCHEDULED,
                                 TaskState.RETRIED))
#: Position of each state in a task's life; a late event never moves a task back.
TASK_STATE_RANK: dict[str, int] = {s: i for i, s in enumerate(TaskState)}

#: Ray's ``ErrorType`` name of a task that failed by raising (``list_tasks``'s error_type),
#: written by the owner (``ResultsMixin``) and, for an actor's ``__init__``, the GCS.
APP_ERROR_TYPE = "TASK_EXECUTION_EXCEPTION"

#: Enum types the codec checks and decodes, by the name used in field annotations.
WIRE_ENUMS: dict[str, type[IntEnum] | type[StrEnum]] = {
    cls.__name__: cls for cls in (TaskKind, RetryPolicy, ErrorKind, TaskState, ObjectState, WorkerExitType)}
