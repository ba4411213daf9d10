"""Ray's ``ray.util`` helpers: scheduling strategies, placement groups, ActorPool, named-actor listing."""

from __future__ import annotations

from lumos.actor import list_named_actors
from lumos.util import scheduling_strategies
from lumos.util.actor_pool import ActorPool
from lumos.util.placement_group import (PlacementGroup, get_current_placement_group, get_placement_group,
                                        placement_group, placement_group_table, remove_placement_group)

__all__ = ["scheduling_strategies", "ActorPool", "list_named_actors", "PlacementGroup", "placement_group",
           "remove_placement_group", "get_placement_group", "placement_group_table",
           "get_current_placement_group"]
