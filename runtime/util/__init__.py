"""Ray's ``ray.util`` helpers: scheduling strategies, placement groups, ActorPool, Queue,
multiprocessing Pool, named-actor listing, the node's IP address, the state API."""

from __future__ import annotations

from lumos import state
from lumos.actor import list_named_actors
from lumos.util import multiprocessing, queue, scheduling_strategies
from lumos.util.actor_pool import ActorPool
from lumos.util.placement_group import (PlacementGroup, get_current_placement_group, get_placement_group,
                                        placement_group, placement_group_table, remove_placement_group)

__all__ = ["scheduling_strategies", "ActorPool", "list_named_actors", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group", "queue", "multiprocessing", "state", "get_node_ip_address"]


def get_node_ip_address() -> str:
    """The IP address of this process's node (the address lumos binds to), or of this
    machine when lumos is not initialized."""
    from lumos._private import worker_context
    cw = worker_context.core_worker
    if cw is not None:
        return cw.node_ip  # type: ignore[no-any-return]
    import socket
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
