"""Ray's ``ray.util`` helpers: scheduling strategies, placement groups, ActorPool, Queue,
multiprocessing Pool, named-actor listing, the node's IP address, the state API."""

from __future__ import annotations

from lumos import state
from lumos.api import get_node_ip_address
from lumos.actor import list_named_actors
from lumos.util import multiprocessing, queue, scheduling_strategies
from lumos.util.actor_pool import ActorPool
from lumos.util.placement_group import (PlacementGroup, get_current_placement_group, get_placement_group,
                                        placement_group, placement_group_table, remove_placement_group)

__all__ = ["scheduling_strategies", "ActorPool", "list_named_actors", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group", "queue", "multiprocessing", "state", "get_node_ip_address"]
