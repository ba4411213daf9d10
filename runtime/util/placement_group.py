"""Placement groups (Ray's ``ray.util.placement_group``): resources reserved together.

    >>> pg = lumos.util.placement_group([{"CPU": 1, "GPU": 1}] * 2, strategy="STRICT_SPREAD")
    >>> lumos.get(pg.ready(), timeout=60)          # every bundle is reserved
    >>> f.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
    >>> lumos.util.remove_placement_group(pg)

The GCS places the bundles (gcs/placement_groups.py) and the raylets hold them; tasks
and actors scheduled into a bundle run on its node, from its resources, seeing its GPUs.
"""

from __future__ import annotations

import math
import numbers
import time
from typing import Any

from lumos._private import worker_context
from lumos.exceptions import GetTimeoutError
from lumos._private.ids import PlacementGroupID, random_id

__all__ = ["PlacementGroup", "PlacementGroupID", "placement_group", "remove_placement_group",
           "get_placement_group", "placement_group_table", "get_current_placement_group"]

STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")


class PlacementGroupID:
    """A placement group's id (16 bytes)."""

    __slots__ = ("_id",)

    def __init__(self, id_bytes: bytes) -> None:
        if not isinstance(id_bytes, bytes):
            raise TypeError(f"a PlacementGroupID is made from bytes, not {type(id_bytes).__name__}")
        self._id = id_bytes

    def binary(self) -> bytes:
        return self._id

    def hex(self) -> str:
        return self._id.hex()

    def is_nil(self) -> bool:
        return not any(self._id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroupID) and other._id == self._id

    def __hash__(self) -> int:
        return hash(self._id)

    def __repr__(self) -> str:
        return f"PlacementGroupID({self.hex()})"

    def __reduce__(self) -> tuple[Any, ...]:
        return PlacementGroupID, (self._id,)


class PlacementGroup:
    """A handle to a placement group; pass it to ``PlacementGroupSchedulingStrategy``."""

    def __init__(self, id: PlacementGroupID, bundle_cache: list[dict[str, float]] | None = None) -> None:
        self.id = id
        self.bundle_cache = bundle_cache

    @property
    def bundle_specs(self) -> list[dict[str, float]]:
        """Each bundle's resources."""
        if self.bundle_cache is None:
            info = _info(self.id.binary())
            self.bundle_cache = [dict(b) for b in info.bundles] if info is not None else []
        return [dict(b) for b in self.bundle_cache]

    @property
    def bundle_count(self) -> int:
        return len(self.bundle_specs)

    @staticmethod
    def empty() -> "PlacementGroup":
        """The "no group" placement group (Ray's ``PlacementGroup.empty()``)."""
        return PlacementGroup(PlacementGroupID(bytes(16)), [])

    @property
    def is_empty(self) -> bool:
        return self.id.is_nil()

    def ready(self) -> Any:
        """An ObjectRef that resolves (to this group) once every bundle is reserved.

        It is a zero-CPU task scheduled into the group, so it waits exactly as long as
        work in the group would. ``lumos.get(pg.ready(), timeout=...)`` or ``lumos.wait``.
        """
        from lumos.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        if self.is_empty:  # (the "no group" group: nothing to reserve, as in Ray)
            from lumos.api import put
            return put(self)
        check = _ready_check()
        return check.options(scheduling_strategy=PlacementGroupSchedulingStrategy(self, -1)).remote(self)

    def wait(self, timeout_seconds: float = 30) -> bool:
        """Block until every bundle is reserved: True, or False after ``timeout_seconds``
        (also when the GCS is down or restarting meanwhile).

        Raises:
            ValueError: the group was removed.
        """
        from lumos._private.protocol import messages as m
        if self.is_empty:
            return False  # (as in Ray: the "no group" group is never created)
        if isinstance(timeout_seconds, bool) or not isinstance(timeout_seconds, numbers.Real) or \
                timeout_seconds < 0 or math.isnan(timeout_seconds):
            raise ValueError(f"timeout_seconds must be a number >= 0, got {timeout_seconds!r}")
        cw = worker_context.require()
        deadline = time.monotonic() + float(timeout_seconds)
        while True:
            left = deadline - time.monotonic()
            chunk = max(0.0, min(left, 60.0))
            try:
                # The GCS answers after ``chunk``; a second more for the reply to arrive.
                if _call(cw, m.WaitPlacementGroupReady(self.id.binary(), chunk), timeout_s=chunk + 1):
                    return True
            except GetTimeoutError:
                pass  # the GCS did not answer in time (down or restarting): asked again until the deadline
            if time.monotonic() >= deadline:
                return False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PlacementGroup) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        return f"PlacementGroup({self.id.hex()})"

    def __reduce__(self) -> tuple[Any, ...]:
        return PlacementGroup, (self.id, self.bundle_cache)


def placement_group(bundles: list[dict[str, float]], strategy: str = "PACK", name: str = "",
                    lifetime: str | None = None, _max_cpu_fraction_per_node: float | None = None,
                    _soft_target_node_id: str | None = None,
                    bundle_label_selector: list[dict[str, str]] | None = None,
                    topology_strategy: Any = None) -> PlacementGroup:
    """Reserve ``bundles`` of resources on the cluster as one group.

    Args:
        bundles: one ``{resource: amount}`` dict per bundle, e.g. ``[{"CPU": 1, "GPU": 1}] * 4``.
        strategy: ``"PACK"`` (as few nodes as possible), ``"SPREAD"`` (as many as possible),
            ``"STRICT_PACK"`` (one node, else pending), ``"STRICT_SPREAD"`` (one node per
            bundle, else pending).
        name: a name to find it with ``get_placement_group`` (unique per namespace).
        lifetime: None (removed when this job ends) or ``"detached"``.
        bundle_label_selector: one ``label_selector`` per bundle (``{}`` for none): the
            node a bundle is reserved on meets its conditions.

    Returns:
        A ``PlacementGroup``; reservation happens in the background (``ready()``, ``wait()``).

    Raises:
        ValueError / TypeError: malformed bundles, strategy, name or lifetime.

    Example:
        >>> pg = placement_group([{"CPU": 1}, {"CPU": 1}], strategy="SPREAD")
        >>> lumos.get(pg.ready(), timeout=30)
    """
    from lumos._private.protocol import messages as m
    from lumos._private.compat import not_implemented_error
    if topology_strategy is not None:
        raise not_implemented_error("placement_group(topology_strategy=...)", "use strategy='PACK', 'SPREAD', "
                                    "'STRICT_PACK' or 'STRICT_SPREAD'")
    _check_bundles(bundles)
    if strategy is None:
        strategy = "PACK"  # (Ray reads None as its default)
    if strategy not in STRATEGIES:
        raise ValueError(f"invalid placement group strategy {strategy!r}; valid: {', '.join(STRATEGIES)}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if lifetime not in (None, "detached", "non_detached"):
        raise ValueError(f"lifetime must be None or 'detached', got {lifetime!r}")
    labels = _bundle_labels(bundle_label_selector, len(bundles))
    cw = worker_context.require_or_init()
    pg_id = random_id(16)
    clean = [{k: float(v) for k, v in b.items() if v} for b in bundles]
    _call(cw, m.CreatePlacementGroup(pg_id, clean, strategy, name, _namespace(cw), cw.job_id,
                                       lifetime == "detached", labels))
    return PlacementGroup(PlacementGroupID(pg_id), clean)


def remove_placement_group(placement_group: PlacementGroup) -> None:
    """Free the group's bundles; tasks and actors running in them are stopped.

    Raises:
        TypeError: not a ``PlacementGroup``.
    """
    from lumos._private.protocol import messages as m
    if not isinstance(placement_group, PlacementGroup):
        raise TypeError(f"remove_placement_group() takes a PlacementGroup, not {type(placement_group).__name__}")
    _call(worker_context.require(), m.RemovePlacementGroup(placement_group.id.binary()))


def get_placement_group(placement_group_name: str) -> PlacementGroup:
    """The live placement group called ``placement_group_name`` in this job's namespace.

    Raises:
        ValueError: no such group.
    """
    from lumos._private.protocol import messages as m
    if not isinstance(placement_group_name, str) or not placement_group_name:
        raise ValueError("placement_group_name must be a non-empty str")
    cw = worker_context.require()
    info = _call(cw, m.GetPlacementGroup(None, placement_group_name, _namespace(cw)))
    if info is None:
        raise ValueError(f"no placement group named {placement_group_name!r} in namespace {_namespace(cw)!r}")
    return PlacementGroup(PlacementGroupID(info.pg_id), [dict(b) for b in info.bundles])


def placement_group_table(placement_group: PlacementGroup | None = None) -> dict[str, Any]:
    """Every placement group as Ray shows it (keyed by hex id), or one group's entry."""
    from lumos._private.protocol import messages as m
    cw = worker_context.require_or_init()
    if placement_group is not None:
        info = _call(cw, m.GetPlacementGroup(placement_group.id.binary()))
        return _row(info) if info is not None else {}
    return {info.pg_id.hex(): _row(info) for info in _call(cw, m.ListPlacementGroups(None))}


def get_current_placement_group() -> PlacementGroup | None:
    """The placement group the current task runs in (None in the driver or outside a group)."""
    cw = worker_context.require_or_init()
    if not worker_context.is_worker or cw.executor is None:
        return None
    spec = getattr(cw.executor, "_running", None)
    strategy = getattr(spec, "strategy", None) if spec is not None else None
    actor = getattr(cw.executor, "actor", None)
    if not strategy and actor is not None:
        strategy = actor.strategy  # a method call: the actor's own placement
    if not strategy:
        strategy = cw.capture_strategy
    if strategy and strategy[0] == "PG":
        return PlacementGroup(PlacementGroupID(bytes(strategy[1])))
    return None


# ----------------------------------------------------------------------------- helpers


def _bundle_labels(selectors: Any, n: int) -> list[list[Any]]:
    """``bundle_label_selector`` as each bundle's wire conditions ([] when none has any).

    Raises:
        TypeError / ValueError: not a list of ``n`` selectors, or a condition lumos cannot read.
    """
    from lumos.util.scheduling_strategies import _selector_conditions
    if not selectors:
        return []
    if not isinstance(selectors, list) or len(selectors) != n:
        raise ValueError(f"bundle_label_selector must be a list of one label selector per bundle ({n}), "
                         f"got {selectors!r}")
    out = [_selector_conditions(sel, f"bundle_label_selector[{i}]") for i, sel in enumerate(selectors)]
    return out if any(out) else []

_READY_CHECK: Any = None


def _ready_check() -> Any:
    global _READY_CHECK
    if _READY_CHECK is None:
        import lumos

        def bundle_reservation_check(pg: PlacementGroup) -> PlacementGroup:
            return pg

        _READY_CHECK = lumos.remote(num_cpus=0, max_retries=0)(bundle_reservation_check)
    return _READY_CHECK


def _check_bundles(bundles: Any) -> None:
    if not isinstance(bundles, (list, tuple)) or not bundles:
        raise ValueError("bundles must be a non-empty list of {resource: amount} dicts, "
                         "e.g. [{'CPU': 1}, {'CPU': 1, 'GPU': 1}]")
    for i, b in enumerate(bundles):
        if not isinstance(b, dict):
            raise TypeError(f"bundle {i} must be a dict of resource -> amount, not {type(b).__name__}")
        for k, v in b.items():
            if not isinstance(k, str):
                raise TypeError(f"bundle {i}: resource names must be str, got {k!r}")
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or v < 0 or math.isnan(v) or math.isinf(v):
                raise ValueError(f"bundle {i}: {k} must be a finite number >= 0, got {v!r}")
            if k == "GPU" and v > 1 and v != int(v):
                raise ValueError(f"bundle {i}: GPU={v!r}: fractions are allowed only below 1")
        if not any(b.values()):
            raise ValueError(f"bundle {i} is {b!r}: a bundle cannot be empty or hold only zero amounts")


def _call(cw: Any, msg: Any, timeout_s: float | None = None) -> Any:
    """A GCS request; the table's ValueError/TypeError (bad name, removed group) surface as such."""
    from lumos._private.transport.connection import RemoteError
    try:
        return cw.call_gcs(msg, timeout_s)
    except RemoteError as e:
        if e.type_name in ("ValueError", "TypeError"):
            raise (ValueError if e.type_name == "ValueError" else TypeError)(e.text) from None
        raise


def _namespace(cw: Any) -> str:
    from lumos.actor import _current_namespace
    return _current_namespace(cw)


def _info(pg_id: PlacementGroupID) -> Any:
    from lumos._private.protocol import messages as m
    return _call(worker_context.require(), m.GetPlacementGroup(pg_id))


def _row(info: Any) -> dict[str, Any]:
    return {
        "placement_group_id": info.pg_id.hex(),
        "name": info.name,
        "namespace": info.namespace,
        "bundles": {i: dict(b) for i, b in enumerate(info.bundles)},
        "bundles_to_node_id": {i: n.hex() if n is not None else "" for i, n in enumerate(info.bundle_nodes)},
        # lumos only: the node GPU indices each placed bundle holds (what its tasks see).
        "bundles_to_gpu_ids": {i: list(ids) for i, ids in enumerate(info.bundle_gpu_ids) if ids},
        "strategy": info.strategy,
        "state": info.state,
        "is_detached": info.detached,
        "job_id": info.job_id.hex(),
        # Ray's scheduling state names; lumos's words on why a group waits, beside them.
        "stats": {"scheduling_state": _scheduling_state(info), "scheduling_detail": info.detail},
    }


def _scheduling_state(info: Any) -> str:
    """Ray's ``PlacementGroupStats.SchedulingState`` name for the group's state."""
    from lumos._private.protocol.cluster_messages import PG_INFEASIBLE_DETAIL, PG_WAITING_DETAIL
    if info.state == "CREATED":
        return "FINISHED"
    if info.state == "REMOVED":
        return "REMOVED"
    if info.detail.startswith(PG_INFEASIBLE_DETAIL):
        return "INFEASIBLE"
    if info.detail == PG_WAITING_DETAIL:
        return "NO_RESOURCES"
    return "QUEUED"
