"""``lumos.get_runtime_context()``: ids and resources of the current process and task."""

from __future__ import annotations

import warnings
from typing import Any

from lumos._private import worker_context
from lumos._private.protocol import messages as m


def _deprecated(name: str, instead: str) -> None:
    warnings.warn(f"RuntimeContext.{name} is deprecated (as in Ray); use {instead} instead",
                  DeprecationWarning, stacklevel=3)


class RuntimeContext:
    """Where the calling code runs: job, node, worker, task, actor."""

    def get_job_id(self) -> str:
        return worker_context.require().job_id.hex()

    def get_node_id(self) -> str:
        return worker_context.require().node_id.hex()

    def get_worker_id(self) -> str:
        return worker_context.require().worker_id.hex()

    def get_task_id(self) -> str | None:
        cw = worker_context.require()
        if not worker_context.is_worker:
            return None
        call = worker_context.current_call.get()  # a threaded or async actor's call
        return (call.task_id if call is not None else cw.current_task_id).hex()

    def get_actor_id(self) -> str | None:
        actor = worker_context.require().current_actor_id
        return actor.hex() if actor else None

    def get_task_name(self) -> str | None:
        cw = worker_context.require()
        call = worker_context.current_call.get() if worker_context.is_worker else None
        return (call.name if call is not None else cw.current_task_name) or None

    def get_assigned_resources(self) -> dict[str, float]:
        cw = worker_context.require()
        if not worker_context.is_worker or cw.executor is None:
            return {}
        host = cw.executor.actor
        if host is not None:  # an actor's method: what the actor holds, as in Ray
            return dict(host.resources)
        spec = cw.executor._running
        return dict(spec.resources) if spec is not None else {}

    def get_resource_ids(self) -> dict[str, list[str]]:
        """The ids of the resources held by the current task or actor, e.g.
        ``{"GPU": ["0"]}`` (Ray's ``get_resource_ids``; ``{}`` in a driver)."""
        cw = worker_context.require()
        if not worker_context.is_worker:
            return {}
        return {k: [str(i) for i in v] for k, v in (cw.current_resource_ids or {}).items()}

    def get_task_function_name(self) -> str | None:
        """The ``module.qualname`` of the running task's function (None in a driver)."""
        cw = worker_context.require()
        spec = (worker_context.current_call.get() or getattr(cw.executor, "_running", None)
                if worker_context.is_worker else None)
        if spec is None:
            return None
        host = cw.executor.actor
        if spec.kind == m.TaskKind.ACTOR_TASK and host is not None:  # Ray's module.Class.method
            cls = type(host.instance)
            return f"{cls.__module__}.{cls.__qualname__}.{spec.function_name}"
        return spec.function_name  # type: ignore[no-any-return]

    def get_session_name(self) -> str:
        """The cluster session's name (its session directory's name)."""
        import os
        return os.path.basename(os.path.normpath(worker_context.require().session_dir))

    def get_temp_dir(self) -> str:
        """The cluster session's directory on this node (logs, sockets)."""
        return str(worker_context.require().session_dir)

    def get_node_labels(self) -> dict[str, str]:
        """The labels of this process's node (``init(labels=...)``, ``lumos start
        --labels``; ``{}`` without), which ``label_selector`` selects nodes by."""
        cw = worker_context.require()
        for node in cw.call_gcs(m.GetAllNodes()):
            if node.node_id == cw.node_id:
                return dict(node.labels)
        return {}

    def get_runtime_env_string(self) -> str:
        """``runtime_env`` as JSON."""
        import json
        return json.dumps(self.runtime_env)

    @property
    def should_capture_child_tasks_in_placement_group(self) -> bool:
        """Whether tasks submitted here go into the current placement group by default."""
        return worker_context.require().capture_strategy is not None

    def get_accelerator_ids(self) -> dict[str, list[str]]:
        from lumos.api import get_gpu_ids
        return {"GPU": [str(g) for g in get_gpu_ids()]}

    def get_placement_group_id(self) -> str | None:
        """Hex id of the placement group the current task or actor runs in, or None."""
        from lumos.util.placement_group import get_current_placement_group
        pg = get_current_placement_group()
        return pg.id.hex() if pg is not None else None

    @property
    def current_placement_group_id(self) -> str | None:
        return self.get_placement_group_id()

    def get_actor_name(self) -> str | None:
        """The current actor's name: "" for an unnamed actor, None outside an actor (as in Ray)."""
        cw = worker_context.require()
        actor = getattr(cw.executor, "actor", None)
        if actor is None:  # in the actor's __init__: its name is in the creation task's options
            spec = getattr(cw.executor, "_running", None)
            if spec is not None and spec.kind == m.TaskKind.ACTOR_CREATION_TASK:
                return str((spec.actor_options or {}).get("name") or "")
            return None
        return actor.name or ""

    def is_canceled(self) -> bool:
        """Whether ``cancel()`` was called on the running task or actor method. A running
        actor method is not interrupted by ``cancel()``: it can poll this to stop early.

        Raises:
            RuntimeError: called from a driver, or from an async actor's call (which is
                cancelled as an asyncio task instead).
        """
        cw = worker_context.require()
        ex = cw.executor
        flag = ex.is_canceled() if worker_context.is_worker and ex is not None else None
        if flag is None:
            raise RuntimeError("is_canceled() works inside a task or a sync or threaded actor's method "
                               "only (an async actor's call is cancelled as an asyncio task)")
        return flag

    @property
    def runtime_env(self) -> Any:
        """The runtime environment in effect here, a ``lumos.runtime_env.RuntimeEnv`` (a
        dict): the environment variables (the job's, under the task's or actor's own) as
        ``{"env_vars": {...}}``, and the job's ``working_dir`` and ``py_modules`` as the URIs
        of their packages; empty when none is set."""
        cw = worker_context.require()
        env: dict[str, str] = {}
        if cw.executor is not None:
            job = cw.job_id  # (an actor's: its creator's, ``Executor._bind_job``)
            env.update(cw.executor._job_env.get(job, {}))
            out: dict[str, Any] = dict(cw.executor._job_code_env.get(job, {}))
        else:
            if cw.job_env_vars:
                env.update(cw.job_env_vars)
            out = dict(cw.job_code_env)
        if cw.inherited_env:
            env.update(cw.inherited_env)
        if env:
            out["env_vars"] = env
        from lumos.runtime_env import RuntimeEnv
        return RuntimeEnv(**out, _validate=False)

    @property
    def namespace(self) -> str:
        return worker_context.require().namespace

    @property
    def gcs_address(self) -> str:
        addr = worker_context.require().gcs_address
        return addr if isinstance(addr, str) else f"{addr[0]}:{addr[1]}"

    @property
    def was_current_actor_reconstructed(self) -> bool:
        cw = worker_context.require()
        executor = getattr(cw, "executor", None)  # (None in a driver)
        return bool(executor is not None and executor.actor_restarted)

    @property
    def current_actor(self) -> Any:
        """The handle of the actor this code runs in (Ray's ``current_actor``).

        Raises:
            RuntimeError: called outside an actor.
        """
        from lumos._private.protocol import messages as m
        from lumos.actor import _handle_from_info
        cw = worker_context.require()
        actor_id = cw.current_actor_id
        if not actor_id:
            raise RuntimeError("current_actor is only available inside an actor's method or __init__")
        info = cw.call_gcs(m.GetActorInfo(actor_id))
        if info is None:
            raise RuntimeError(f"actor {actor_id.hex()} is not known to the GCS")
        cw._post(cw.actor_submitter.track, info.actor_id, info)
        return _handle_from_info(info)

    # Deprecated in Ray but public: the ids as id objects (``.hex()`` gives the string).
    @property
    def job_id(self) -> bytes:
        _deprecated("job_id", "get_job_id()")
        return worker_context.require().job_id

    @property
    def node_id(self) -> bytes:
        _deprecated("node_id", "get_node_id()")
        return worker_context.require().node_id

    @property
    def task_id(self) -> bytes | None:
        _deprecated("task_id", "get_task_id()")
        cw = worker_context.require()
        return cw.current_task_id if worker_context.is_worker else None

    @property
    def actor_id(self) -> bytes | None:
        _deprecated("actor_id", "get_actor_id()")
        return worker_context.require().current_actor_id or None

    def get(self) -> dict[str, Any]:
        return {"job_id": self.get_job_id(), "node_id": self.get_node_id(),
                "worker_id": self.get_worker_id(), "task_id": self.get_task_id(),
                "actor_id": self.get_actor_id(), "namespace": self.namespace}

    def __repr__(self) -> str:
        return f"RuntimeContext({self.get()!r})"


def get_runtime_context() -> RuntimeContext:
    worker_context.require()
    return RuntimeContext()
