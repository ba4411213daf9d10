"""Resource arithmetic for one node, exact for fractions.

Amounts are kept as integers in units of 1/10000 so ``0.1 + 0.2`` of a GPU adds up.
GPUs (and other resources listed in ``INSTANCE_RESOURCES``) are tracked per instance,
so a lease learns *which* GPUs it holds: ``{"GPU": [[index, fraction], ...]}``.
"""

from __future__ import annotations

from typing import Any, Mapping

UNIT = 10_000
INSTANCE_RESOURCES = frozenset(("GPU",))


def to_units(amount: float) -> int:
    return int(round(amount * UNIT))


def from_units(units: int) -> float:
    value = units / UNIT
    return int(value) if value == int(value) else value  # type: ignore[return-value]


class NodeResources:
    """Totals and what is free, with per-instance tracking for GPUs."""

    def __init__(self, total: Mapping[str, float]) -> None:
        #: Resource -> total units.
        self.total: dict[str, int] = {k: to_units(v) for k, v in total.items() if v > 0}
        #: Resource -> free units (may dip below zero while blocked workers resume).
        self.available: dict[str, int] = dict(self.total)
        #: Instance resource -> free units per instance.
        self.instances: dict[str, list[int]] = {}
        for name in INSTANCE_RESOURCES:
            count = self.total.get(name, 0) // UNIT
            if count:
                self.instances[name] = [UNIT] * count

    def feasible(self, request: Mapping[str, int]) -> bool:
        """Could this request ever run here (against totals)?"""
        for name, units in request.items():
            if units > self.total.get(name, 0):
                return False
        return True

    def fits(self, request: Mapping[str, int]) -> bool:
        avail = self.available
        for name, units in request.items():
            if units > avail.get(name, 0):
                return False
            inst = self.instances.get(name)
            if inst is not None and _pick_instances(inst, units) is None:
                return False
        return True

    def allocate(self, request: Mapping[str, int]) -> dict[str, list[list[Any]]]:
        """Take ``request`` (which must fit); return the instances granted."""
        ids: dict[str, list[list[Any]]] = {}
        for name, units in request.items():
            self.available[name] = self.available.get(name, 0) - units
            inst = self.instances.get(name)
            if inst is not None and units:
                picks = _pick_instances(inst, units)
                assert picks is not None, "allocate() called on a request that does not fit"
                for index, amount in picks:
                    inst[index] -= amount
                ids[name] = [[index, amount / UNIT] for index, amount in picks]
        return ids

    def release(self, request: Mapping[str, int], ids: Mapping[str, list[list[Any]]]) -> None:
        for name, units in request.items():
            self.available[name] = self.available.get(name, 0) + units
        for name, picks in ids.items():
            inst = self.instances.get(name)
            if inst is None:
                continue
            for index, fraction in picks:
                inst[index] += to_units(fraction)

    def take(self, name: str, units: int) -> None:
        """Adjust a plain amount (used for CPUs of blocked workers)."""
        self.available[name] = self.available.get(name, 0) - units

    def as_floats(self, which: Mapping[str, int]) -> dict[str, float]:
        return {k: from_units(v) for k, v in which.items()}


def _pick_instances(free: list[int], units: int) -> list[tuple[int, int]] | None:
    """Whole instances for amounts >= 1; best-fit single instance for a fraction."""
    if units >= UNIT:
        whole = units // UNIT
        full = [i for i, f in enumerate(free) if f == UNIT]
        if len(full) < whole or units % UNIT:
            return None
        return [(i, UNIT) for i in full[:whole]]
    best = None
    for i, f in enumerate(free):
        if f >= units and (best is None or f < free[best]):
            best = i
    return None if best is None else [(best, units)]


def request_units(resources: Mapping[str, float]) -> dict[str, int]:
    return {k: to_units(v) for k, v in resources.items() if v}
