"""The one configuration object of a lumos cluster.

Owns every tunable knob. Resolved once when a process starts (defaults, then
``LUMOS_<FIELD>`` environment variables, then ``init(_system_config=...)``) and
handed to child processes as JSON on their command line. Nothing below this module
reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

_ENV_PREFIX = "LUMOS_"


@dataclasses.dataclass(frozen=True)
class Config:
    #: Values whose serialized size is below this stay inline in their owner.
    max_inline_object_bytes: int = 100 * 1024
    #: Task arguments passed by value above this size are put into the object store.
    max_inline_arg_bytes: int = 100 * 1024
    #: Largest frame a connection accepts after authentication.
    max_frame_bytes: int = 256 * 1024 * 1024
    #: Largest frame accepted before the peer has authenticated.
    max_preauth_frame_bytes: int = 1024
    #: Deadline for the authentication handshake.
    handshake_timeout_s: float = 5.0
    #: Deadline for connecting to a peer (GCS, raylet, worker).
    connect_timeout_s: float = 10.0
    #: Deadline for one control-plane RPC that should answer at once.
    rpc_timeout_s: float = 30.0
    #: How often raylets report load and resources to the GCS.
    heartbeat_interval_ms: int = 500
    #: A node that misses heartbeats this long is declared dead.
    node_death_timeout_ms: int = 5000
    #: How often core workers flush buffered task events to the GCS.
    task_event_flush_interval_ms: int = 100
    #: Task events kept by the GCS before the oldest are trimmed.
    task_event_max_records: int = 100_000
    #: How long an owner keeps an idle leased worker before returning it.
    lease_idle_timeout_ms: int = 200
    #: Tasks pushed to one leased worker before its earlier ones finish (short tasks only).
    max_tasks_in_flight_per_worker: int = 8
    #: Tasks of a shape whose mean run time is below this are pipelined; others go one at a time.
    pipeline_below_ms: float = 2.0
    #: Lease requests one owner keeps in flight per scheduling key.
    max_pending_lease_requests: int = 10
    #: Leases one owner holds at once for one scheduling key.
    max_leases_per_scheduling_key: int = 64
    #: Workers started ahead of demand per node (-1: one per CPU).
    num_prestart_workers: int = -1
    #: Idle workers above the prestart count are stopped after this long.
    worker_idle_timeout_s: float = 10.0
    #: Hard cap on worker processes per node (-1: 4 x CPUs + 8).
    max_workers_per_node: int = -1
    #: Deadline for a new worker process to register with its raylet.
    worker_register_timeout_s: float = 30.0
    #: Object store capacity per node in bytes (0: 30% of RAM, capped by /dev/shm).
    object_store_memory: int = 0
    #: Freed store files kept for reuse (already-faulted pages make puts faster).
    object_store_recycle_bytes: int = 1024 * 1024 * 1024
    #: How long a create waits for space (frees, spilling) before failing.
    object_store_full_timeout_s: float = 10.0
    #: Threads used to copy large buffers into the store.
    memcpy_threads: int = 4
    #: Buffers at least this large are copied with several threads.
    memcpy_threshold_bytes: int = 1024 * 1024
    #: Sync calls wait in slices of this length so Ctrl-C is noticed.
    wait_slice_s: float = 0.1
    #: Forward worker stdout/stderr to the driver.
    log_to_driver: bool = True
    #: Check the invariants of every ...State after each event (tests).
    validate: bool = False
    #: Warn about infeasible tasks after they have waited this long.
    infeasible_warning_s: float = 1.0

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> "Config":
        """Defaults < ``LUMOS_<FIELD>`` environment variables < ``overrides``."""
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, field in fields.items():
            raw = environ.get(_ENV_PREFIX + name.upper())
            if raw is not None:
                values[name] = _parse(field.type, raw, name)
        for name, value in (overrides or {}).items():
            if name not in fields:
                raise ValueError(
                    f"unknown _system_config key {name!r}; valid keys: {', '.join(sorted(fields))}")
            values[name] = value
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return cls(**json.loads(text))


def _parse(type_name: Any, raw: str, name: str) -> Any:
    kind = type_name if isinstance(type_name, str) else getattr(type_name, "__name__", "str")
    try:
        if kind == "bool":
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
    except ValueError:
        raise ValueError(f"environment variable {_ENV_PREFIX}{name.upper()}={raw!r} is not a valid {kind}") from None
    return raw
