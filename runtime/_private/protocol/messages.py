"""Every lumos message type and the msgpack codec, under one name.

``from lumos._private.protocol import messages as m`` then ``m.PushTask(...)``,
``m.encode(...)``, ``m.TaskKind.ACTOR_TASK``. The classes live by area:

- ``codec.py``: ``@message(code)``, ``encode``/``decode``, frame kinds, nesting bound;
- ``vocab.py``: ``TaskKind``, ``RetryPolicy``, ``ErrorKind``, ``TaskState``, ``ObjectState``;
- ``task_messages.py``: ``TaskSpec``, ``PushTask``, ``TaskReply``, object status (1-9, 60-69);
- ``gcs_messages.py``: nodes, jobs, KV, task events, pub/sub, actors (10-39, 70-99);
- ``raylet_messages.py``: leases and the object store (40-59);
- ``cluster_messages.py``: spillback, transfers, placement groups, node logs (108-139).

Who sends what:

```
core worker --RegisterJob/Kv*/AddTaskEvents/Subscribe--> GCS
raylet      --RegisterNode/NodeHeartbeat/LogBatch--> GCS
core worker --RequestWorkerLease/ReturnWorker/CreateObject/FreeObjects--> raylet
owner       --PushTask/CancelTask--> executing worker
executing worker --GeneratorItem (streaming), TaskReply--> owner
borrower    --GetObjectStatus/AddBorrowers/RemoveBorrowers--> owner
reader      --ObjectCopied--> owner --KeepObjectCopies--> raylet (a copy outlives its node)
```
"""

from __future__ import annotations

from lumos._private.protocol.codec import (  # noqa: F401
    _REGISTRY, ERROR, MAX_MESSAGE_NESTING, NOTIFY, REPLY, REQUEST, _default, _ext_hook, decode, encode, message)
from lumos._private.protocol.task_messages import (  # noqa: F401
    Address, Dep, TaskSpec, ReturnObject, GeneratorItem, TaskReply,
    PushTask, CancelTask, GetObjectStatus, ObjectStatus, AddBorrowers, RemoveBorrowers, ObjectCopied,
    GetCoreWorkerStats, ExitWorker, placement_group_of, label_conditions_of, labels_match,
    label_choices_of, label_soft_of, label_spread_of, describe_label_conditions)
from lumos._private.protocol.gcs_messages import (  # noqa: F401
    NodeInfo, RegisterNode, NodeHeartbeat, GetAllNodes, RegisterJob, JobInfo,
    MarkJobFinished, GetAllJobs, KvPut, KvGet, KvDel, KvKeys,
    TaskEvent, PackedTaskRow, AddTaskEvents, GetTasks, Subscribe, Publish, WorkerInfo,
    ReportWorker, GetAllWorkers, LogBatch, FlushLogs, PublishError, GetClusterStatus, NodeResources,
    ActorInfo, RegisterActor, GetActorInfo, GetNamedActor, KillActor, ListActors,
    ActorExiting, GetTaskUpdates, ReportMetrics, GetMetrics, MAX_JOB_METADATA_BYTES, check_job_metadata)
from lumos._private.protocol.raylet_messages import (  # noqa: F401
    GCS_OWNER, JOB_END_EXIT_S, RegisterClient, RequestWorkerLease, LeaseGrant, ReturnWorker, LeasedWorkerExited,
    WorkerBlocked, WorkerUnblocked, CreateObject, SealObject, ReserveSlots, FreeObjects, GetWorkerExit, KillWorker,
    GetNodeStats, MarkShared, ShutdownNode, DropSlots, PinObjects, RestoreSpilled,
    DropMappings)
from lumos._private.protocol.cluster_messages import (  # noqa: F401
    ScheduleLease, SpillbackReply, RequestSpilledLease, LeaseRecalled, OwnersStopped, PullObject, ReadObjectChunk,
    GetObjectSize, FreeObjectCopies, KeepObjectCopies, ReserveBundles, ReleaseBundles, PlacementGroupInfo, CreatePlacementGroup,
    RemovePlacementGroup, GetPlacementGroup, ListPlacementGroups, WaitPlacementGroupReady, GetNodeLog, NodeLog)
from lumos._private.protocol.vocab import (  # noqa: F401
    PENDING_TASK_STATES, TASK_STATE_RANK, TERMINAL_TASK_STATES, ErrorKind, ObjectState, RetryPolicy, TaskKind,
    TaskState, WorkerExitType)

__all__ = [
    "_REGISTRY",
    "GCS_OWNER",
    "JOB_END_EXIT_S",
    "ERROR",
    "MAX_MESSAGE_NESTING",
    "NOTIFY",
    "REPLY",
    "REQUEST",
    "_default",
    "_ext_hook",
    "decode",
    "encode",
    "message",
    "Address",
    "Dep",
    "TaskSpec",
    "ReturnObject",
    "GeneratorItem",
    "TaskReply",
    "PushTask",
    "CancelTask",
    "GetObjectStatus",
    "ObjectStatus",
    "AddBorrowers",
    "RemoveBorrowers",
    "ObjectCopied",
    "GetCoreWorkerStats",
    "ExitWorker",
    "NodeInfo",
    "RegisterNode",
    "NodeHeartbeat",
    "GetAllNodes",
    "RegisterJob",
    "JobInfo",
    "MarkJobFinished",
    "GetAllJobs",
    "KvPut",
    "KvGet",
    "KvDel",
    "KvKeys",
    "TaskEvent",
    "PackedTaskRow",
    "AddTaskEvents",
    "ReportMetrics",
    "GetMetrics",
    "GetTasks",
    "Subscribe",
    "Publish",
    "WorkerInfo",
    "ReportWorker",
    "GetAllWorkers",
    "LogBatch",
    "FlushLogs",
    "PublishError",
    "GetClusterStatus",
    "NodeResources",
    "ActorInfo",
    "RegisterActor",
    "GetActorInfo",
    "GetNamedActor",
    "KillActor",
    "ListActors",
    "ActorExiting",
    "GetTaskUpdates",
    "RegisterClient",
    "RequestWorkerLease",
    "LeaseGrant",
    "ReturnWorker",
    "LeasedWorkerExited",
    "WorkerBlocked",
    "WorkerUnblocked",
    "CreateObject",
    "SealObject",
    "ReserveSlots",
    "FreeObjects",
    "GetWorkerExit",
    "KillWorker",
    "GetNodeStats",
    "MarkShared",
    "ShutdownNode",
    "DropSlots",
    "PinObjects",
    "RestoreSpilled",
    "DropMappings",
    "ScheduleLease",
    "SpillbackReply",
    "RequestSpilledLease",
    "LeaseRecalled",
    "OwnersStopped",
    "PullObject",
    "ReadObjectChunk",
    "GetObjectSize",
    "FreeObjectCopies",
    "KeepObjectCopies",
    "ReserveBundles",
    "ReleaseBundles",
    "PlacementGroupInfo",
    "CreatePlacementGroup",
    "RemovePlacementGroup",
    "GetPlacementGroup",
    "ListPlacementGroups",
    "WaitPlacementGroupReady",
    "GetNodeLog",
    "NodeLog",
    "PENDING_TASK_STATES",
    "TASK_STATE_RANK",
    "TERMINAL_TASK_STATES",
    "ErrorKind",
    "RetryPolicy",
    "TaskKind",
    "TaskState",
    "WorkerExitType",
    "ObjectState",
]
