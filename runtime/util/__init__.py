"""Ray's ``ray.util`` helpers: scheduling strategies, placement groups, accelerator
model names, ActorPool, Queue,
multiprocessing Pool, application metrics (Counter, Gauge, Histogram), named-actor listing, the node's IP address, the state API, results
as they complete; and lumos's own public hooks for front ends: ``output`` (where worker
output goes on the driver) and ``session`` (session directories on this machine, and
the plumbing of a process a node starts).

Everything here is public. May import: the public API (``lumos.api``, ``lumos.actor``,
``lumos.state``, …) and ``lumos._private`` (this package is one of the places that wrap
it under stable names). Never ``lumos.kernelext`` or ``lumos.dashboard``.
"""

from __future__ import annotations

from typing import Any

from lumos._private.compat import missing_function
from lumos.api import get_node_ip_address
from lumos.actor import list_named_actors
from lumos.util import accelerators, metrics, multiprocessing, output, queue, scheduling_strategies, session, state
from lumos.util.actor_pool import ActorPool
from lumos.util.completion import as_completed, map_unordered
from lumos.util.debug import disable_log_once_globally, enable_periodic_logging, inspect_serializability, log_once
from lumos.util.pickling import deregister_serializer, register_serializer
from lumos.util.placement_group import (PlacementGroup, get_current_placement_group, get_placement_group,
                                        placement_group, placement_group_table, remove_placement_group)

_CLIENT = "Ray Client is not part of lumos; join a cluster with lumos.init(address='lumos://HOST:PORT')"
connect = missing_function("ray.util.connect", _CLIENT)
disconnect = missing_function("ray.util.disconnect", _CLIENT + " and leave it with lumos.shutdown()")
get_node_instance_id = missing_function("ray.util.get_node_instance_id",
                                        "lumos has no cloud instance ids; use get_runtime_context().get_node_id()")

#: Ray's ``ray.util`` submodules lumos does not have, and what to use instead.
_NOT_IN_LUMOS = {
    "collective": "lumos has no collective communication library; pass arrays through the object store "
                  "(lumos.put) or use torch.distributed inside actors",
    "pdb": "the Ray debugger is not part of lumos; errors carry the remote traceback",
    "ray_debugpy": "the Ray debugger is not part of lumos; errors carry the remote traceback",
    "iter": "ray.util.iter was removed from Ray; use lumos.util.as_completed or map_unordered",
}


def __getattr__(name: str) -> Any:
    if name in _NOT_IN_LUMOS:
        raise AttributeError(f"module 'lumos.util' has no attribute {name!r}: Ray's ray.util.{name} is not "
                             f"implemented in lumos; {_NOT_IN_LUMOS[name]}")
    raise AttributeError(f"module 'lumos.util' has no attribute {name!r}")


__all__ = ["accelerators", "scheduling_strategies", "ActorPool", "list_named_actors", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group", "queue", "multiprocessing", "state", "get_node_ip_address",
           "as_completed", "map_unordered", "log_once", "disable_log_once_globally", "enable_periodic_logging",
           "inspect_serializability", "connect", "disconnect", "register_serializer", "deregister_serializer",
           "get_node_instance_id", "output", "session", "metrics"]
