"""The one configuration object of a lumos cluster.

Owns every tunable knob. Resolved once when a process starts (defaults, then
``LUMOS_<FIELD>`` environment variables, then ``init(_system_config=...)``) and
handed to child processes as JSON on their command line. Nothing below this module
reads ``os.environ`` for configuration.

``resolve`` checks every value against its field's annotation and range, so a bad
knob fails in the caller (``init``, ``Cluster``, ``lumos start``) with the field's name,
not later on a GCS or raylet command line. A numeric field accepts finite values ``>= 0``
unless its default is wrapped in ``_positive`` (``> 0``) or an ``..._or_auto`` helper
(also ``-1``, "pick for me").
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import reprlib
import sys
import types
import typing
from typing import Any, Mapping, TypeVar

_ENV_PREFIX = "LUMOS_"
_T = TypeVar("_T")
#: Value of a count that means "pick for me" (see the field's comment).
_AUTO = -1
#: Unit shown in error messages, by field-name suffix.
_UNITS = {"_ms": "milliseconds", "_s": "seconds", "_bytes": "bytes"}
#: How environment variables spell a bool (``_system_config`` takes only True and False).
_ENV_BOOLS = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}


@dataclasses.dataclass(frozen=True, slots=True)
class _Range:
    """The numbers a numeric field accepts."""

    #: ``> 0`` rather than ``>= 0``.
    positive: bool = False
    #: ``_AUTO`` is accepted too.
    auto: bool = False
    #: ``<= 1`` as well (a fraction).
    at_most_one: bool = False

    def admits(self, value: float) -> bool:
        if self.at_most_one and value > 1:
            return False
        return (self.auto and value == _AUTO) or (value > 0 if self.positive else value >= 0)

    def __str__(self) -> str:
        bound = "> 0" if self.positive else ">= 0"
        if self.at_most_one:
            bound += " and <= 1"
        return f"{bound} or {_AUTO} (automatic)" if self.auto else bound


def _knob(default: _T, rng: _Range) -> _T:
    return dataclasses.field(default=default, metadata={"range": rng})


def preload_modules(value: str) -> list[str]:
    """The module names of ``worker_preload_modules`` (or ``worker_warm_modules``)."""
    return [name.strip() for name in value.split(",") if name.strip()]


#: Heavy libraries whose import a node's workers skip when the process starting the node
#: has imported them (``worker_warm_modules="auto"``); each is imported and forked by
#: many programs already (torch's DataLoader forks its workers).
WARM_IF_IMPORTED = ("torch", "pandas")


def warm_modules_for_node(config: "Config") -> "Config":
    """``config`` with ``worker_warm_modules="auto"`` made concrete for a node this process
    starts: the ``WARM_IF_IMPORTED`` modules it has imported."""
    if config.worker_warm_modules != "auto":
        return config
    found = [name for name in WARM_IF_IMPORTED if name in sys.modules]
    return dataclasses.replace(config, worker_warm_modules=",".join(found))


def _positive(default: _T) -> _T:
    """A size, interval, timeout or count where 0 would hang, spin or refuse everything."""
    return _knob(default, _Range(positive=True))


def _positive_or_auto(default: _T) -> _T:
    return _knob(default, _Range(positive=True, auto=True))


def _non_negative_or_auto(default: _T) -> _T:
    return _knob(default, _Range(auto=True))


def _fraction(default: _T) -> _T:
    """A share of something: ``> 0`` and ``<= 1``."""
    return _knob(default, _Range(positive=True, at_most_one=True))


@dataclasses.dataclass(frozen=True)
class Config:
    #: Values whose serialized size is below this stay inline in their owner.
    max_inline_object_bytes: int = 100 * 1024
    #: Task arguments passed by value above this size are put into the object store.
    max_inline_arg_bytes: int = 100 * 1024
    #: Such an argument, for a worker on this node, is lent in a reserved store slot that
    #: takes the next one once its task is done (False: each is a sealed, freed object).
    lend_args: bool = True
    #: A torch tensor's storage of at least this many bytes, read from the store, is
    #: rebuilt on the object's pages, copy-on-write, instead of copied (0: every tensor
    #: is copied, as Ray does).
    torch_in_place_min_bytes: int = 64 * 1024
    #: Largest frame a connection accepts after authentication.
    max_frame_bytes: int = _positive(256 * 1024 * 1024)
    #: Largest frame accepted before the peer has authenticated.
    max_preauth_frame_bytes: int = _positive(1024)
    #: Deadline for the whole authentication handshake (not per read).
    handshake_timeout_s: float = _positive(5.0)
    #: A dropped peer (failed handshake, bad frame) is logged once per address per this long.
    peer_warning_interval_s: float = 60.0
    #: Deadline for connecting to a peer (GCS, raylet, worker).
    connect_timeout_s: float = _positive(10.0)
    #: Deadline for one control-plane RPC that should answer at once.
    rpc_timeout_s: float = _positive(30.0)
    #: How often raylets report load and resources to the GCS.
    heartbeat_interval_ms: int = _positive(500)
    #: A node that misses heartbeats this long is declared dead.
    node_death_timeout_ms: int = _positive(5000)
    #: How often core workers flush buffered task events to the GCS.
    task_event_flush_interval_ms: int = _positive(100)
    #: How often a process reports the application metrics it recorded (``lumos.util.metrics``)
    #: to the GCS, at most; it reports at once when it exits.
    metrics_report_interval_ms: int = _positive(1000)
    #: Application-metric series (metric and tag set) the GCS holds; new ones past it are dropped.
    metrics_max_series: int = _positive(100_000)
    #: How long the flushes leave a task submitted here unreported while it has not ended
    #: (0: the first flush reports it). One that ends within it goes to the GCS as one
    #: packed row; one reported before its end as two rows, which cost the GCS twice the
    #: CPU: in a burst longer than a few flushes, most of its calls. A poller (the
    #: dashboard) sees a pending task up to this much, and one flush, later;
    #: ``lumos.state.list_tasks`` and ``get_task`` send this process's events first.
    task_event_hold_ms: int = 400
    #: Task records the GCS keeps in memory (and in its Redis stream) before the oldest finished go to its archive.
    task_event_max_records: int = 100_000
    #: The same bound in estimated bytes of GCS memory (about 2 KB per no-op task): keeps the GCS flat.
    task_event_max_bytes: int = _positive(32 * 1024 * 1024)
    #: The GCS's task archive on disk (``logs/task_events.msgpack`` and its rotated ``.1``) stays under this.
    task_event_archive_max_bytes: int = _positive(1 << 30)
    #: How long a worker idle after a task reads its owner's socket without sleeping, for
    #: the next task of a caller making sync calls in a loop (0: sleep at once). It goes on
    #: only while it pays: a worker whose next task came later does not spin after it.
    #: 400: a caller's turn between sync calls with a 1 MiB argument (its copy into the
    #: store, ~0.1 ms, and its own wake-ups when asleep) came 200-250 us after the reply
    #: once any spin had missed, so a 200 us spin never paid again and such calls stayed
    #: at ~0.35 ms instead of ~0.18 (two runs in three; the owner's spin alone did not help).
    worker_spin_us: int = 400
    #: How long an owner's io thread, after a task's reply released a user thread's wait
    #: for one object (a sync call's get), goes on polling its sockets without sleeping,
    #: for the reply to that thread's next call (0: sleep at once). Only while such replies
    #: come that close together: a caller that takes longer between calls gets no spin.
    owner_spin_us: int = 300
    #: How long an owner keeps an idle leased worker before returning it.
    lease_idle_timeout_ms: int = 200
    #: Tasks pushed to one leased worker before its earlier ones finish (short tasks only).
    max_tasks_in_flight_per_worker: int = _positive(8)
    #: Tasks of a shape whose mean run time is below this are pipelined; others go one at a time.
    pipeline_below_ms: float = 2.0
    #: Lease requests one owner keeps in flight per scheduling key.
    max_pending_lease_requests: int = _positive(10)
    #: Leases one owner holds at once for one scheduling key: a bound against runaway
    #: growth, not a limit a cluster should meet (as in Ray, whose owners have none). At
    #: 64, one driver ran a function on at most 64 workers however many CPUs the cluster
    #: had. Leases whose workers wait in get() or wait() are not counted.
    max_leases_per_scheduling_key: int = _positive(10_000)
    #: Workers started ahead of demand per node (-1: one per CPU).
    num_prestart_workers: int = _non_negative_or_auto(-1)
    #: Idle workers above the prestart count are stopped after this long.
    worker_idle_timeout_s: float = 10.0
    #: Hard cap on worker processes per node that run tasks (-1: 4 x CPUs + 8). Actors'
    #: workers and workers whose task waits in get() or wait() are not counted: a chain of
    #: nested tasks, like an actor, always gets a process.
    max_workers_per_node: int = _positive_or_auto(-1)
    #: How raylets start workers: "fork" (from a pre-imported template process, copy-on-write;
    #: falls back to "spawn" where it cannot) or "spawn" (a new interpreter each).
    worker_start: str = "fork"
    #: Modules every worker will import, comma-separated ("torch,transformers"): the fork
    #: server imports them before it forks its first worker, and every worker shares their
    #: pages and skips the import (a heavy module in 200 actors: one import, not 200). A
    #: worker started with "spawn" imports them as it starts. One that cannot be imported
    #: is logged (the raylet's log) and skipped.
    worker_preload_modules: str = ""
    #: Modules the fork server imports once it is idle, after numpy, comma-separated:
    #: workers forked later share them; one forked before imports what it uses itself.
    #: "auto": those of ``WARM_IF_IMPORTED`` that the process starting the node has
    #: imported (a notebook that imported torch: its workers skip torch's ~1 s import
    #: each). "": none.
    worker_warm_modules: str = "auto"
    #: A fork server makes each worker the raylet's own child with ``clone(CLONE_PARENT)``
    #: where the platform allows (glibc on x86-64/arm64); False: always the double fork.
    worker_fork_clone: bool = True
    #: glibc's malloc in worker processes: blocks up to this size come from the heap rather
    #: than a fresh mmap each (0: glibc's own adaptive threshold). With the adaptive one a
    #: new worker's first 256 KiB temporary set the threshold to 256 KiB and the trim point
    #: to 512 KiB, so a task freeing two such arrays gave the pages back and faulted them
    #: in again on every call: numpy on a 64 KiB frame ran 7x slower in some workers.
    worker_malloc_mmap_threshold_bytes: int = 4 * 1024 * 1024
    #: Free memory at the top of a worker's heap kept for reuse up to this much (glibc's
    #: ``M_TRIM_THRESHOLD``; used with the threshold above).
    worker_malloc_trim_threshold_bytes: int = _positive(32 * 1024 * 1024)
    #: glibc's ``memcpy`` in worker processes writes copies of at least this many bytes
    #: with non-temporal stores (x86-64 Linux; 0: glibc's own choice, from the cache size
    #: the machine reports). Large returns and puts are copied into store files that no
    #: cache holds; a VM that reports its host's whole cache makes glibc's own threshold
    #: ~190 MiB, and a 1 MiB copy there took twice as long (``process.worker_exec_env``).
    worker_nontemporal_copy_bytes: int = 1024 * 1024
    #: Deadline for a new worker process to register with its raylet.
    worker_register_timeout_s: float = _positive(30.0)
    #: Log files (``logs/worker-*.out`` and ``.log``) of this many exited workers are kept
    #: per node; older ones are deleted as more workers exit, so a long-lived node that
    #: starts many short-lived workers (``max_calls``, actors) does not fill its disk.
    worker_logs_kept: int = _positive(1000)
    #: Object store capacity per node in bytes (0: 30% of RAM, capped by /dev/shm).
    object_store_memory: int = 0
    #: Freed store files kept for reuse (already-faulted pages make puts faster; a new
    #: file's pages cost ~0.4-0.8 ms per MiB here, so a burst of 2,000 1 MiB returns
    #: re-made every file past this); a create that needs room evicts them first.
    object_store_recycle_bytes: int = 4 * 1024 * 1024 * 1024
    #: A freed store file kept for reuse that no create took for this long is removed,
    #: and a slot reserved for a process's next puts that it has not used for this long
    #: is taken back, so a burst's files do not hold /dev/shm on an idle node of a
    #: shared machine (0: both kept until the store needs the room). The next burst after
    #: that pays for fresh pages again (the microbenchmark's "first round" row), so it
    #: is longer than a notebook's usual pause between cells.
    object_store_pool_idle_s: float = 60.0
    #: How long a create waits for space (frees, spilling) before failing.
    object_store_full_timeout_s: float = 10.0
    #: Session directories (logs, spill files) of clusters that ended that a node start
    #: keeps, the newest; it removes older ones (0: keep them all).
    session_dirs_kept: int = 50
    #: Where a node spills primary copies when its store is full ("": ``spill/`` in the
    #: session directory); each node uses a private (0700) subdirectory of it.
    object_spilling_directory: str = ""
    #: Spill primaries to disk under memory pressure (False: a full store only waits or fails).
    object_spilling_enabled: bool = True
    #: Above this fraction of the store in use, primaries are spilled ahead of need.
    object_spilling_threshold: float = _positive(0.8)
    #: Threads used to copy large buffers into the store.
    memcpy_threads: int = _positive(4)
    #: Buffers at least this large are copied with several threads.
    memcpy_threshold_bytes: int = 1024 * 1024
    #: Sync calls wait in slices of this length so Ctrl-C is noticed.
    wait_slice_s: float = _positive(0.1)
    #: Forward worker stdout/stderr to the driver.
    log_to_driver: bool = True
    #: At a script's exit, how long the driver waits for the tasks it submitted to finish
    #: and their output to arrive before it disconnects (0: not at all).
    exit_drain_timeout_s: float = 10.0
    #: Check the invariants of every ...State after each event (tests).
    validate: bool = False
    #: Warn about infeasible tasks after they have waited this long.
    infeasible_warning_s: float = 1.0
    #: Dead actors the GCS keeps in its table (``list_actors``, the dashboard, storage),
    #: the most recently dead; older ones are forgotten (Ray's name; its default is
    #: 100,000, which at ~2 KB a row is more than a small machine should hold).
    maximum_gcs_destroyed_actor_cached_count: int = _positive(10_000)
    #: Where the GCS keeps its tables: "memory", or
    #: "redis://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]" (sharded; survives a GCS restart).
    gcs_storage: str = "memory"
    #: Deadline for one read or write batch on the GCS storage (Redis).
    gcs_storage_timeout_s: float = _positive(5.0)
    #: How long raylets, workers and drivers try to reach a restarted GCS before giving up.
    gcs_reconnect_timeout_s: float = _positive(60.0)
    #: ``lumos start --head`` with durable ``gcs_storage``: a keeper process starts the GCS
    #: again when it dies (not when stopped), until it has been down gcs_reconnect_timeout_s.
    gcs_restart_on_failure: bool = True
    #: The GCS exits when its storage (Redis) has been unreachable this long, reporting
    #: itself unhealthy meanwhile; raylets and drivers then wait gcs_reconnect_timeout_s
    #: for a GCS restarted over the storage, as after any GCS death.
    gcs_storage_unavailable_exit_s: float = _positive(60.0)
    #: How often the GCS checks that its storage answers and still holds its tables.
    gcs_storage_check_interval_ms: int = 1000
    #: Client mode (``lumos://``): how often the client and its session on the head ping each other.
    client_heartbeat_interval_s: float = _positive(1.0)
    #: Client mode: silence this long on the client link means it is lost (either end).
    client_heartbeat_timeout_s: float = _positive(10.0)
    #: Client mode: a session waits this long for its client to reconnect before it ends,
    #: freeing the client's objects and killing its actors.
    client_reconnect_grace_s: float = _positive(30.0)
    #: How often the raylet samples node memory (0: no memory monitor).
    memory_monitor_refresh_ms: int = 250
    #: Fraction of node memory (or of the cgroup limit) above which a worker is killed.
    memory_usage_threshold: float = _fraction(0.95)
    #: A task whose worker the memory monitor killed runs again after this, doubled per attempt.
    task_oom_retry_delay_base_ms: int = 1000

    @classmethod
    def resolve(cls, overrides: Mapping[str, Any] | None = None,
                environ: Mapping[str, str] | None = None) -> "Config":
        """Defaults < ``LUMOS_<FIELD>`` environment variables < ``overrides``.

        Raises:
            ValueError: an unknown override key, an environment variable that does not
                parse, or a number out of its field's range (or not finite).
            TypeError: an override of the wrong type (``"yes"`` or ``1`` for a bool,
                ``True`` for a number, ``None`` for a field that is not optional).
        """
        environ = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for name, field in fields.items():
            var = _ENV_PREFIX + name.upper()
            raw = environ.get(var)
            if raw is not None:
                values[name] = _check_env(field, raw, f"environment variable {var} ({name})")
        for name, value in (overrides or {}).items():
            if name not in fields:
                raise ValueError(
                    f"unknown _system_config key {name!r}; valid keys: {', '.join(sorted(fields))}")
            values[name] = _check(fields[name], value, f"_system_config[{name!r}]")
        if values.get("worker_start", "fork") not in ("fork", "spawn"):
            raise ValueError(f"worker_start must be 'fork' or 'spawn', got {values['worker_start']!r}")
        for key in ("worker_preload_modules", "worker_warm_modules"):
            for name in preload_modules(values.get(key, "")):
                if not all(part.isidentifier() for part in name.split(".")):
                    raise ValueError(f"{key}: {name!r} is not a module name "
                                     "(give them comma-separated: 'torch,transformers')")
        if "gcs_storage" in values:
            from lumos._private.gcs.storage import check_storage_url
            check_storage_url(values["gcs_storage"])
        return cls(**values)

    def to_json(self) -> str:
        """The config for a child's command line, where every local user can read it: the
        GCS storage URL loses its password (the GCS reads the whole URL from a private file)."""
        from lumos._private.gcs.storage import redact_url
        values = dataclasses.asdict(self)
        values["gcs_storage"] = redact_url(self.gcs_storage)
        return json.dumps(values)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return cls(**json.loads(text))


@functools.cache
def _hints() -> dict[str, Any]:
    # Annotations are strings here (``from __future__ import annotations``).
    return typing.get_type_hints(Config)


def _split_optional(hint: Any) -> tuple[Any, bool]:
    """``(T, True)`` for ``T | None``, else ``(hint, False)``."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) < len(typing.get_args(hint)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True
    return hint, False


def _expected(field: dataclasses.Field[Any]) -> str:
    hint, optional = _split_optional(_hints()[field.name])
    rng = field.metadata.get("range", _Range())
    unit = next((f" ({u})" for suffix, u in _UNITS.items() if field.name.endswith(suffix)), "")
    if hint is bool:
        text = "True or False"
    elif hint is int:
        text = f"an int {rng}{unit}"
    elif hint is float:
        text = f"a finite number {rng}{unit}"
    else:
        text = f"a {getattr(typing.get_origin(hint) or hint, '__name__', hint)}"
    return f"{text} or None" if optional else text


def _check(field: dataclasses.Field[Any], value: Any, label: str) -> Any:
    """``value`` if ``field`` accepts it (an int for a float field comes back as a float)."""
    hint, optional = _split_optional(_hints()[field.name])
    if value is None and optional:
        return None
    got = f"got {reprlib.repr(value)} ({type(value).__name__})"
    if hint in (int, float):
        # bool is an int subclass; True for a count or a timeout is a mistake, not 1.
        if isinstance(value, bool) or not isinstance(value, int if hint is int else (int, float)):
            raise TypeError(f"{label} must be {_expected(field)}, {got}")
        if hint is float:
            try:
                value = float(value)
            except OverflowError:  # an int beyond 1e308
                value = math.inf
        if not math.isfinite(value) or not field.metadata.get("range", _Range()).admits(value):
            raise ValueError(f"{label} must be {_expected(field)}, {got}")
        return value
    origin = typing.get_origin(hint) or hint
    if isinstance(origin, type) and not isinstance(value, origin):
        raise TypeError(f"{label} must be {_expected(field)}, {got}")
    return value


def _check_env(field: dataclasses.Field[Any], raw: str, label: str) -> Any:
    """The value of ``field`` that the environment string ``raw`` spells."""
    hint, _ = _split_optional(_hints()[field.name])
    expected = f"one of {', '.join(_ENV_BOOLS)}" if hint is bool else _expected(field)
    try:
        if hint is bool:
            value: Any = _ENV_BOOLS[raw.lower()]
        elif hint is int:
            value = int(raw)
        elif hint is float:
            value = float(raw)
        elif hint is dict or typing.get_origin(hint) is dict:
            value = json.loads(raw)
        else:
            value = raw
        return _check(field, value, label)
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{label} must be {expected}, got {raw!r}") from None
