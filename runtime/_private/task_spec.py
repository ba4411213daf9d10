"""Building task specs: the one keyword-only way to describe a task, an actor creation or
an actor method call.

A call is described in two halves. ``task_template`` makes the ``TaskTemplate``: what
does not change between calls of one function with one set of options (name,
resources, retries, strategy). The public API (``remote_function.py``, ``actor.py``)
builds it once per function and options. ``new_task_spec`` makes the ``TaskSpec`` of
one call from a template and the call's own facts (its id, arguments, owner, actor
sequence number); the core worker calls it at submission.

```
@remote / .options() ──task_template(...)──► TaskTemplate (cached per options)
f.remote(*args) ──core worker──new_task_spec(template, ...)──► TaskSpec ──PushTask / RegisterActor──►
```
"""

from __future__ import annotations

from typing import Any, Iterable

from lumos._private import serialization as ser
from lumos._private.core_worker.tasks import TaskTemplate
from lumos._private.ids import ActorID, JobID, TaskID, WorkerID
from lumos._private.protocol import messages as m
from lumos._private.protocol.vocab import RetryPolicy, TaskKind

__all__ = ["retry_policy_of", "task_template", "new_task_spec"]


def retry_policy_of(retry_exceptions: bool | Iterable[type[BaseException]]) -> tuple[RetryPolicy, bytes | None]:
    """The wire form of a ``retry_exceptions`` option: the policy and, for a list of
    exception classes, the list pickled (the executor matches raised errors against it)."""
    if retry_exceptions is True:
        return RetryPolicy.ANY_EXCEPTION, None
    if retry_exceptions:
        # By value where pickle would name them: a class defined in the driver's script
        # (``__main__``) is not importable on a worker.
        return RetryPolicy.LISTED_EXCEPTIONS, ser.dumps_code(list(retry_exceptions))
    return RetryPolicy.NEVER, None


def task_template(*, kind: TaskKind, function_id: bytes, function_name: str, name: str,
                  num_returns: int = 1, resources: dict[str, float] | None = None, max_retries: int = 0,
                  retry_exceptions: bool | Iterable[type[BaseException]] = False, strategy: Any = None,
                  pickled_function: bytes | None = None, runtime_env: dict[str, str] | None = None,
                  max_calls: int = 0, enable_task_events: bool = True) -> TaskTemplate:
    """The per-function, per-options half of a task's spec.

    Args:
        kind: a normal task, an actor's creation (``num_returns`` 1, no retries: the GCS
            restarts actors) or an actor method call (``function_id`` empty: the method is
            looked up on the actor by ``function_name``).
        function_id: the exported function's or class's id (``function_id_of``).
        function_name: ``module.qualname`` (an actor call: the method's name).
        name: the name shown in the task log and the dashboard.
        num_returns: results per call; -1 for a streaming generator.
        retry_exceptions: the ``retry_exceptions`` option (bool or exception classes).
        strategy: the scheduling strategy's wire form (``options.strategy_of``), or None.

    Raises:
        ValueError: a field that does not fit ``kind``.
    """
    if kind == TaskKind.ACTOR_CREATION_TASK and (num_returns != 1 or max_retries):
        raise ValueError("an actor creation returns 1 value and is not retried (the GCS restarts actors), "
                         f"got num_returns={num_returns}, max_retries={max_retries}")
    if kind == TaskKind.ACTOR_TASK and function_id:
        raise ValueError("an actor method call names its method in function_name; function_id must be empty")
    policy, types = retry_policy_of(retry_exceptions)
    return TaskTemplate(function_id, function_name, name, num_returns, resources if resources is not None else {},
                        max_retries, policy, types, strategy, kind, pickled_function=pickled_function,
                        runtime_env=runtime_env, max_calls=max_calls, enable_task_events=enable_task_events)


def new_task_spec(template: TaskTemplate, *, task_id: TaskID, job_id: JobID, parent_task_id: TaskID,
                  owner: m.Address, args: bytes, deps: list[m.Dep] | None = None,
                  nested_refs: list[Any] | None = None, root_task_id: TaskID | None = None,
                  actor_id: ActorID | None = None, sequence_no: int = 0, caller_id: WorkerID | None = None,
                  actor_options: Any = None, runtime_env: dict[str, str] | None = None) -> m.TaskSpec:
    """The spec of one call of ``template`` (first attempt).

    Args:
        task_id: a fresh id (``new_task_id()``); its returns are ``return_object_id(task_id, i)``.
        parent_task_id: the submitting task (the driver's root task for a driver).
        owner: the submitter's address: results and borrow requests go there.
        args: serialized ``(args, kwargs)``, top-level refs replaced by placeholders for ``deps``.
        nested_refs: ``[object_id, owner Address]`` of refs nested inside ``args``.
        actor_id: the actor created (creation) or called (method call).
        sequence_no: an actor call's per-caller sequence number; ``caller_id`` is the caller.
        actor_options: a creation's options (name, max_restarts, ...), or a call's
            concurrency group.
        runtime_env: environment variables of the task or actor (None: the job's).

    Raises:
        ValueError: ``actor_id`` missing for an actor creation or call.
    """
    kind = template.kind
    if kind != TaskKind.NORMAL_TASK and not actor_id:
        raise ValueError(f"a {TaskKind(kind).name} needs the actor_id")
    spec = m.TaskSpec(
        task_id, job_id, parent_task_id, kind, template.name, template.function_id, template.function_name,
        args, deps if deps is not None else [], nested_refs if nested_refs is not None else [],
        1 if kind == TaskKind.ACTOR_CREATION_TASK else template.num_returns, template.resources,
        template.max_retries, template.retry_exceptions, template.retry_exception_types, owner, 0,
        template.strategy, actor_id, sequence_no, caller_id, actor_options, root_task_id, runtime_env)
    if kind == TaskKind.NORMAL_TASK and template.max_calls:
        spec.max_calls = template.max_calls
    if not template.enable_task_events:
        spec.enable_task_events = False
    return spec
