"""lumos: a Jupyter-first cluster toolkit with Ray's API.

    import lumos as ray
    ray.init()

    @ray.remote
    def square(x):
        return x * x

    ray.get([square.remote(i) for i in range(4)])   # [0, 1, 4, 9]
"""

from __future__ import annotations

from typing import Any

from lumos import dag, exceptions, job_config, runtime_env, state, util
from lumos.actor import ActorClass, ActorHandle, get_actor, kill, method
from lumos.api import (LumosContext, available_resources, cancel, cluster_resources, get, get_gpu_ids, init,
                       is_initialized, nodes, put, shutdown, timeline, wait)
from lumos.generator import DynamicObjectRefGenerator, ObjectRefGenerator
from lumos.logging_config import LoggingConfig
from lumos.object_ref import ObjectRef
from lumos.progress import progress
from lumos.remote_function import RemoteFunction
from lumos.runtime_context import get_runtime_context

__version__ = "0.1.0"

__all__ = [
    "init", "shutdown", "is_initialized", "remote", "kill", "get_actor", "method", "ActorHandle", "ActorClass", "get", "put", "wait", "cancel", "nodes",
    "cluster_resources", "available_resources", "get_gpu_ids", "get_runtime_context", "timeline",
    "ObjectRef", "ObjectRefGenerator", "DynamicObjectRefGenerator", "LoggingConfig", "progress", "LumosContext", "dag", "exceptions", "job_config", "runtime_env", "state", "util", "load_ipython_extension", "__version__",
]


def remote(*args: Any, **options: Any) -> Any:
    """Make a function a remote function (a task) or a class an actor.

    Used bare (``@lumos.remote``) or with options (``@lumos.remote(num_cpus=2)``).
    """
    if len(args) == 1 and not options and callable(args[0]):
        return _make_remote(args[0], {})
    if args:
        raise TypeError("@lumos.remote takes keyword options only, e.g. @lumos.remote(num_gpus=1)")

    def decorate(target: Any) -> Any:
        return _make_remote(target, options)

    return decorate


def _make_remote(target: Any, options: dict[str, Any]) -> Any:
    import inspect
    if isinstance(target, type):
        return ActorClass(target, options)
    # As in Ray: a function (or a Cython one), never another callable (an instance with
    # __call__, a bound method, a functools.partial), whose state would be copied silently.
    if inspect.iscoroutinefunction(target):  # as in Ray: its coroutine could not even be returned
        raise ValueError(f"'async def' cannot be a remote task ({target.__qualname__}): make it a plain "
                         "function that runs the coroutine (asyncio.run(...)), or a method of an actor, "
                         "whose async methods run on the actor's event loop")
    if inspect.isfunction(target) or type(target).__name__ == "cython_function_or_method":
        return RemoteFunction(target, options)
    raise TypeError(f"@lumos.remote must be applied to a function or a class, not {type(target).__name__!r}; "
                    "for a callable object, wrap it in a function or make its class an actor")


#: Ray's public names lumos does not have, and what to use instead (docs/ray-compatibility.md).
_NOT_IN_LUMOS = {
    "ActorClassID": "ids are hex strings in lumos (get_runtime_context().get_actor_id())",
    "ActorID": "ids are hex strings in lumos (get_runtime_context().get_actor_id())",
    "FunctionID": "ids are hex strings in lumos",
    "JobID": "ids are hex strings in lumos (get_runtime_context().get_job_id())",
    "NodeID": "ids are hex strings in lumos (get_runtime_context().get_node_id())",
    "ObjectID": "use ObjectRef (ref.hex() for its id)",
    "PlacementGroupID": "use lumos.util.placement_group.PlacementGroupID",
    "TaskID": "ids are hex strings in lumos (get_runtime_context().get_task_id())",
    "UniqueID": "ids are hex strings in lumos",
    "WorkerID": "ids are hex strings in lumos (get_runtime_context().get_worker_id())",
    "ClientBuilder": "Ray Client is not part of lumos; join with lumos.init(address='lumos://HOST:PORT')",
    "client": "Ray Client is not part of lumos; join with lumos.init(address='lumos://HOST:PORT')",
    "Language": "lumos runs Python only",
    "cpp_function": "lumos runs Python only",
    "java_function": "lumos runs Python only",
    "java_actor_class": "lumos runs Python only",
    "SCRIPT_MODE": "lumos has no worker modes; lumos._private.worker_context.is_worker tells a worker",
    "WORKER_MODE": "lumos has no worker modes; lumos._private.worker_context.is_worker tells a worker",
    "autoscaler": "lumos does not autoscale; add nodes with `lumos start --address HOST:PORT`",
    "data": "Ray Data is a separate library, not part of lumos; use tasks, actors and lumos.util.multiprocessing",
    "internal": "Ray's internal API is not part of lumos; use lumos.state for cluster state",
    "widgets": "lumos's notebook displays come with %load_ext lumos",
    "workflow": "Ray Workflows is not part of lumos; use tasks with max_retries and actors with checkpoints",
    "_config": "lumos's settings are init(_system_config={...}) and LUMOS_* environment variables",
}


def __getattr__(name: str) -> Any:
    # ``lumos.dashboard`` and ``lumos.kernelext`` load Bokeh/IPython: only when asked for.
    if name in ("dashboard", "kernelext"):
        import importlib
        return importlib.import_module(f"lumos.{name}")
    if name in _NOT_IN_LUMOS:
        raise AttributeError(f"module 'lumos' has no attribute {name!r}: Ray's ray.{name} is not "
                             f"implemented in lumos; {_NOT_IN_LUMOS[name]}")
    raise AttributeError(f"module 'lumos' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext lumos``: registers the notebook magics (imports IPython only now)."""
    from lumos import kernelext
    kernelext.load_ipython_extension(ipython)
