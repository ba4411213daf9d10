"""Owner-side task records, scheduling queues and leases (io thread only).

A ``TaskTemplate`` is everything about a remote function call that does not change
between calls (resources, retries, strategy), computed once per function and options.
A ``PendingTask`` is one submitted call until its reply. Tasks whose arguments are ready
wait in the ``SchedulingQueue`` of their shape; the queue holds the ``LeasedWorker``s
granted by raylets and pipelines tasks to them.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Sequence

from lumos._private.protocol import messages as m
from lumos._private.transport.connection import Connection

#: Process modes (``CoreWorker.mode``).
DRIVER, WORKER = 0, 1

# PendingTask.state
WAITING_ARGS, QUEUED, PUSHED, DONE = 0, 1, 2, 3


class TaskTemplate:
    """Per-function, per-options facts of a task, shared by all its calls."""

    __slots__ = ("function_id", "function_name", "name", "num_returns", "resources", "max_retries",
                 "retry_exceptions", "retry_exception_types", "strategy", "key", "kind",
                 "pickled_function", "runtime_env", "max_calls", "enable_task_events")

    def __init__(self, function_id: bytes, function_name: str, name: str, num_returns: int,
                 resources: dict[str, float], max_retries: int, retry_exceptions: m.RetryPolicy,
                 retry_exception_types: bytes | None, strategy: Any, kind: m.TaskKind = m.TaskKind.NORMAL_TASK,
                 pickled_function: bytes | None = None,
                 runtime_env: dict[str, str] | None = None, max_calls: int = 0,
                 enable_task_events: bool = True) -> None:
        self.function_id = function_id
        self.function_name = function_name
        self.name = name
        self.num_returns = num_returns
        self.resources = resources
        self.max_retries = max_retries
        self.retry_exceptions = retry_exceptions
        self.retry_exception_types = retry_exception_types
        self.strategy = strategy
        self.kind = kind
        #: The function, pickled; exported to the GCS on first use in a job.
        self.pickled_function = pickled_function
        #: Environment variables set while the task (or the actor) runs; None: none.
        self.runtime_env = runtime_env
        #: A worker exits after running the function this many times (0: never).
        self.max_calls = max_calls
        #: False: its calls record no task events (``enable_task_events=False``).
        self.enable_task_events = enable_task_events
        #: Tasks of the same key share leased workers (and a mean run time, which sets
        #: how deep they are pipelined): one function, one resource shape, one strategy,
        #: retriable or not (the lease tells the raylet's memory monitor which it is).
        self.key = (function_id, tuple(sorted(resources.items())), repr(strategy), max_retries != 0)


class PendingTask:
    __slots__ = ("spec", "template", "return_ids", "dep_ids", "nested_ids", "retries_left", "state",
                 "lease", "deps_waiting", "cancelled", "force_cancelled", "queue", "submit_time",
                 "retry_why", "ev_live", "ev_held", "ev_prev", "ev_sched", "ev_node", "ev_worker", "ev_rids")

    def __init__(self, spec: m.TaskSpec, template: TaskTemplate, return_ids: Sequence[bytes],
                 dep_ids: tuple[bytes, ...], nested_ids: tuple[bytes, ...], submit_time: float) -> None:
        self.spec = spec
        self.template = template
        #: (Tuples, ``()`` when none: a burst of calls without arguments holds thousands of
        #: these, and every list among them is one more object each garbage collection walks.)
        self.return_ids = return_ids
        #: Top-level ref arguments (resolved to values before the push).
        self.dep_ids = dep_ids
        #: Refs nested inside arguments (arrive as refs; the executor borrows them).
        self.nested_ids = nested_ids
        self.retries_left = template.max_retries
        self.state = WAITING_ARGS
        self.lease: LeasedWorker | None = None
        #: Arguments not ready yet.
        self.deps_waiting = 0
        self.cancelled = False
        self.force_cancelled = False
        self.queue: SchedulingQueue | None = None
        self.submit_time = submit_time
        #: An actor call put back to be sent again: why (its next attempt starts when it is
        #: sent, so a call that fails before that keeps its attempt number).
        self.retry_why: str | None = None
        # Task events (``SubmissionMixin``): while ``ev_live``, this attempt's events are
        # kept here, not buffered; its end packs them into one row (``_pack_ended``), or a
        # flush reports them (``_spill_events``), after which they are buffered as events.
        self.ev_live = False
        #: Flushes that found it not ended and left it for a later one (``_report_fresh``).
        self.ev_held = 0
        #: An actor call: the caller's previous call to that actor.
        self.ev_prev: bytes | None = None
        #: SCHEDULED: when, on which node and worker, with which resource ids.
        self.ev_sched: float | None = None
        self.ev_node: bytes | None = None
        self.ev_worker: bytes | None = None
        self.ev_rids: Any = None


class LeasedWorker:
    __slots__ = ("lease_id", "worker_id", "address", "node_id", "resource_ids", "conn", "tasks",
                 "idle_timer", "idle_since", "queue", "raylet", "dead", "blocked", "exiting", "direct", "claimed",
                 "claimed_for", "recalled")

    def __init__(self, grant: m.LeaseGrant, queue: "SchedulingQueue", raylet: Connection) -> None:
        self.lease_id = grant.lease_id
        self.worker_id = grant.worker_id
        self.address = grant.worker_address
        self.node_id = grant.node_id
        self.resource_ids = grant.resource_ids
        self.conn: Connection | None = None
        #: Task id -> task pushed to this worker and not yet answered.
        self.tasks: dict[bytes, PendingTask] = {}
        #: The idle timer's handle; it may outlive an idle spell (``CoreWorker._idle_expired``).
        self.idle_timer: Any = None
        #: When (the loop's clock) the worker last went idle; None: busy (or never idle).
        self.idle_since: float | None = None
        self.queue = queue
        #: The raylet that granted the lease (it takes the lease back).
        self.raylet = raylet
        self.dead = False
        #: The worker's running task waits in get(): push nothing more until it answers.
        self.blocked = False
        #: The worker said it exits (a function's max_calls, or its task called
        #: ``sys.exit()``): push nothing more; it runs nothing it receives after saying so.
        #: What its row is to say of that exit (``m.WorkerExitType``); None while it does not.
        self.exiting: str | None = None
        #: User threads may write to ``conn`` (``Connection.write_now``).
        self.direct = False
        #: Its raylet asked for it back (``LeaseRecalled``): push nothing more; it is
        #: returned once its tasks in flight are done.
        self.recalled = False
        #: A user thread wrote a task to this worker that the io thread has not booked yet
        #: (``TaskSubmitterState.claim_idle``): the lease is not idle.
        self.claimed = False
        #: The task of the latest claim (``CoreWorker._settle_claim``).
        self.claimed_for: Any = None


class SchedulingQueue:
    """Ready tasks of one shape and the workers leased for them."""

    __slots__ = ("key", "template", "tasks", "leases", "requesting", "mean_exec_s")

    def __init__(self, key: Any, template: TaskTemplate) -> None:
        self.key = key
        #: A template of this shape (resources and strategy for lease requests).
        self.template = template
        self.tasks: deque[PendingTask] = deque()
        self.leases: list[LeasedWorker] = []
        #: Lease requests in flight.
        self.requesting = 0
        #: Moving average of execution time; short tasks are pipelined deeper.
        self.mean_exec_s: float | None = None
