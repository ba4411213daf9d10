"""The dashboard's mirror of the GCS tables stays bounded on a cluster that runs for long."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from lumos.dashboard import source
from lumos.dashboard.source import ClusterSource


def _actor(i: int, state: str, version: int = 1) -> Any:
    return SimpleNamespace(actor_id=i.to_bytes(16, "big"), state=state, version=version)


def _worker(i: int, state: str) -> Any:
    return SimpleNamespace(worker_id=i.to_bytes(16, "big"), state=state)


def test_dead_actors_and_workers_beyond_the_bound_are_dropped_first_come_first(monkeypatch: Any) -> None:
    monkeypatch.setattr(source, "MAX_DEAD_ROWS", 300)
    src = ClusterSource(None)  # type: ignore[arg-type]  (fed by hand: no client is asked)
    for i in range(100):  # live ones, never dropped
        src._on_actor(_actor(i, "ALIVE"))
        src._on_worker(_worker(i, "ALIVE"))
    for i in range(100, 1100):
        src._on_actor(_actor(i, "ALIVE"))
        src._on_actor(_actor(i, "DEAD", 2))
        src._on_worker(_worker(i, "DEAD"))
    for table in (src.actors, src.workers):
        dead = [int(k, 16) for k, row in table.items() if row.state == "DEAD"]
        assert 300 <= len(dead) < 300 + 256  # (trimmed at every 256th row the table grows by)
        assert dead == list(range(1100 - len(dead), 1100))  # the last to come
        assert sum(1 for row in table.values() if row.state == "ALIVE") == 100
    # The rows keep the order they came in (the actors page lists them so).
    src._on_actor(_actor(5, "DEAD", 2))
    assert int(next(iter(src.actors)), 16) == 0 and src.actors[(5).to_bytes(16, "big").hex()].state == "DEAD"
