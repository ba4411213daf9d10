"""Ray's ``ray.util`` helpers: scheduling strategies (placement groups and ActorPool follow)."""

from __future__ import annotations

from lumos.util import scheduling_strategies

__all__ = ["scheduling_strategies"]
