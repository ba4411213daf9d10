"""The raylet's worker pool: starting, watching, killing and refilling worker processes.

``WorkerPoolState`` decides (pure: events in, actions out, time passed in) how each new
worker starts (forked by the fork server, or spawned), when starts back off because
workers die before registering, and when the fork server is restarted. ``WorkerPool``
owns the processes: it forks or spawns them, watches each through a pidfd, reaps it,
reports it to the GCS, and tells the raylet (``RayletServer.worker_exited``) so leases,
objects and the scheduler learn of it.

```
LocalSchedulerState ─StartWorker─► WorkerPool ─StartRequested─► WorkerPoolState
                                       │ ◄── StartWorker(fork | spawn) / DeferStart ─┘
           request ──► fork server ──► forked worker (cloned as our child, or reparented: subreaper)
           Popen ───────────────────► spawned worker
  pidfd readable ─► waitpid ─► exit code ─► GCS (ReportWorker DEAD), raylet.worker_exited
```
The fork server (``lumos._private.worker.fork_server``, driven through ``fork_client.py``)
is a child of the raylet; when it dies, pending requests are spawned instead and it is
restarted after a backoff.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Union

from lumos._private.ids import JobID, WorkerID, random_id, short
from lumos._private.object_store.client import unlink_quietly
from lumos._private.process import describe_exit, worker_exec_env
from lumos._private.protocol import messages as m
from lumos._private.raylet import memory_monitor as mm
from lumos._private.raylet.fork_client import (FORK_REPLY_TIMEOUT_S, ForkedProcess, ForkServerClient, Process,
                                               children_of_self, set_child_subreaper)
from lumos._private.raylet import scheduler as sc
from lumos._private.raylet.node_report import SUFFIXES as LOG_SUFFIXES
from lumos._private.raylet.node_report import log_name
from lumos._private.transport.connection import Connection

if TYPE_CHECKING:
    from lumos._private.raylet.server import RayletServer

logger = logging.getLogger(__name__)

#: Start methods (``Config.worker_start``).
FORK, SPAWN = "fork", "spawn"

# ----------------------------------------------------------------------------- state


@dataclasses.dataclass(slots=True)
class StartRequested:
    """The scheduler (or the pre-start pool) wants one more worker."""


@dataclasses.dataclass(slots=True)
class DeferredStartDue:
    """The backoff of a deferred start has passed."""


@dataclasses.dataclass(slots=True)
class WorkerRegistered:
    pass


@dataclasses.dataclass(slots=True)
class WorkerExited:
    #: It had registered with the raylet.
    registered: bool
    #: The raylet killed it on purpose (a reason was given).
    killed: bool
    #: Its exit code (negative: the signal's number).
    code: int


@dataclasses.dataclass(slots=True)
class ForkServerReady:
    pass


@dataclasses.dataclass(slots=True)
class ForkServerDied:
    pass


@dataclasses.dataclass(slots=True)
class ForkServerRestartDue:
    pass


Event = Union[StartRequested, DeferredStartDue, WorkerRegistered, WorkerExited, ForkServerReady,
              ForkServerDied, ForkServerRestartDue]


@dataclasses.dataclass(slots=True)
class StartWorker:
    #: ``FORK`` (ask the fork server) or ``SPAWN`` (a new interpreter).
    method: str


@dataclasses.dataclass(slots=True)
class DeferStart:
    delay_s: float


@dataclasses.dataclass(slots=True)
class ReportStartFailures:
    """Workers keep dying before they register: say so (not every time)."""
    in_a_row: int
    next_start_in_s: float


@dataclasses.dataclass(slots=True)
class StartForkServer:
    delay_s: float


Action = Union[StartWorker, DeferStart, ReportStartFailures, StartForkServer]

#: Fork server states.
OFF, STARTING, READY, DOWN = "off", "starting", "ready", "down"
#: A fork server that stayed up this long is healthy again: its restart backoff resets.
FORK_SERVER_HEALTHY_S = 10.0
#: Longest wait before restarting a fork server that keeps dying.
FORK_SERVER_MAX_BACKOFF_S = 30.0
#: Process groups of exited workers remembered (``WorkerPool.reap_orphans``).
DEAD_GROUPS_KEPT = 4096


class WorkerPoolState:
    """Start policy of one raylet's workers (pure)."""

    def __init__(self, method: str = FORK, validate: bool = False) -> None:
        if method not in (FORK, SPAWN):
            raise ValueError(f"worker start method must be {FORK!r} or {SPAWN!r}, not {method!r}")
        self.validate = validate
        #: Workers that died before registering, in a row; starts back off while it grows.
        self.failed_starts = 0
        #: No worker starts before this (monotonic seconds).
        self.backoff_until = 0.0
        #: A start is waiting for the backoff to pass (at most one at a time).
        self.deferred = False
        #: The fork server's state (``OFF`` when workers are spawned).
        self.fork_server = STARTING if method == FORK else OFF
        #: When the running fork server answered ready.
        self.fork_ready_at = 0.0
        #: Fork server deaths since it was last healthy.
        self.fork_deaths = 0

    def handle(self, event: Event, now: float) -> list[Action]:
        actions: list[Action] = []
        if isinstance(event, StartRequested):
            self._start(now, actions)
        elif isinstance(event, DeferredStartDue):
            self.deferred = False
            self._start(now, actions)
        elif isinstance(event, WorkerRegistered):
            self.failed_starts = 0
            self.backoff_until = 0.0
        elif isinstance(event, WorkerExited):
            if not event.registered and not event.killed and event.code > 0:
                self.failed_starts += 1
                delay = min(0.1 * 2 ** self.failed_starts, 2.0)
                self.backoff_until = now + delay
                if self.failed_starts in (1, 5) or self.failed_starts % 20 == 0:
                    actions.append(ReportStartFailures(self.failed_starts, delay))
            elif event.registered:
                self.failed_starts = 0
        elif isinstance(event, ForkServerReady):
            if self.fork_server == STARTING:
                self.fork_server = READY
                self.fork_ready_at = now
        elif isinstance(event, ForkServerDied):
            if self.fork_server in (STARTING, READY):
                if self.fork_server == READY and now - self.fork_ready_at >= FORK_SERVER_HEALTHY_S:
                    self.fork_deaths = 0
                self.fork_deaths += 1
                self.fork_server = DOWN
                actions.append(StartForkServer(min(0.5 * 2 ** (self.fork_deaths - 1), FORK_SERVER_MAX_BACKOFF_S)))
        elif isinstance(event, ForkServerRestartDue):
            if self.fork_server == DOWN:
                self.fork_server = STARTING
        if self.validate:
            self.check_invariants()
        return actions

    def _start(self, now: float, actions: list[Action]) -> None:
        if now < self.backoff_until:
            # Workers have been dying before they registered: start the next one later,
            # not in a loop that burns the machine.
            if not self.deferred:
                self.deferred = True
                actions.append(DeferStart(self.backoff_until - now))
            return
        # Requests sent while the server still imports wait in its pipe.
        actions.append(StartWorker(FORK if self.fork_server in (STARTING, READY) else SPAWN))

    def refill_count(self, alive: int, prestart: int) -> int:
        """Workers to start so ``alive`` workers fill the pre-started pool again (none
        while a start waits out the backoff: it refills once a worker comes up)."""
        return 0 if self.deferred else max(0, prestart - alive)

    def check_invariants(self) -> None:
        assert self.failed_starts >= 0, self.failed_starts
        assert self.fork_server in (OFF, STARTING, READY, DOWN), self.fork_server
        assert self.fork_deaths >= 0, self.fork_deaths

# ----------------------------------------------------------------------------- processes


class WorkerProc:
    """One worker process (or a registered driver) of this raylet."""

    __slots__ = ("worker_id", "process", "pidfd", "conn", "address", "exit_info", "kill_reason",
                 "started", "job_id", "is_driver", "pid", "forked", "exit_deadline", "exit_type")

    def __init__(self, worker_id: WorkerID, process: Process | None) -> None:
        self.worker_id = worker_id
        #: None for a driver, and for a worker whose fork request is not answered yet.
        self.process = process
        self.pidfd = -1
        self.conn: Connection | None = None
        self.address: m.Address | None = None
        #: "exit code N" / "signal SIGKILL" once the process is gone.
        self.exit_info: str | None = None
        self.kill_reason = ""
        #: Why it was stopped, as its row will say (``_exit_type_of``), when a stop said so.
        self.exit_type: str | None = None
        #: Asked to exit on its own (``ExitWorker``) until then (monotonic); 0: not asked.
        self.exit_deadline = 0.0
        self.started = time.monotonic()
        self.job_id: JobID | None = None
        self.is_driver = False
        self.pid = process.pid if process is not None else 0
        #: It came from the fork server.
        self.forked = False



# ----------------------------------------------------------------------------- the pool


class WorkerPool:
    """The worker processes of one raylet (I/O half; ``WorkerPoolState`` decides)."""

    def __init__(self, raylet: "RayletServer", method: str, num_prestart: int) -> None:
        self.raylet = raylet
        self.num_prestart = num_prestart
        self.state = WorkerPoolState(method, validate=raylet.config.validate)
        #: Worker id -> process (workers) or registration (drivers).
        self.procs: dict[WorkerID, WorkerProc] = {}
        #: Worker id -> exit description, kept after the process is gone.
        self.exits: dict[WorkerID, str] = {}
        #: Exited workers whose log files are still kept, oldest first (``worker_logs_kept``).
        self._dead_logs: collections.deque[WorkerID] = collections.deque()
        self.exit_waiters: dict[WorkerID, list[asyncio.Future[str]]] = {}
        self.fork_server: ForkServerClient | None = None
        self._stopping = False
        self._restart_handle: asyncio.TimerHandle | None = None
        #: Orphaned descendants (a task's subprocesses whose worker is gone) become ours.
        self._subreaper = False
        #: Pids of workers that exited lately (each led its own process group): the
        #: processes still in those groups are killed as they become orphans here.
        self._dead_groups: dict[int, None] = {}

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self._subreaper = set_child_subreaper()
        if self.state.fork_server != OFF:
            if self._subreaper:
                self._start_fork_server()
            else:
                logger.warning("cannot become a child subreaper; workers are spawned, not forked")
                self.state.fork_server = OFF
        for _ in range(self.num_prestart):
            self.start_worker()

    def stop(self) -> None:
        self._stopping = True
        if self._restart_handle is not None:
            self._restart_handle.cancel()
        for proc in list(self.procs.values()):
            if proc.process is not None and proc.exit_info is None:
                try:
                    proc.process.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.fork_server is not None:
            self.fork_server.close()
        deadline = time.monotonic() + 2.0
        for proc in list(self.procs.values()):
            if proc.process is not None and proc.exit_info is None:
                try:
                    proc.process.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.error("worker pid %d did not exit", proc.pid)
            self._close_pidfd(proc)
        self._end_orphans()

    def _end_orphans(self, grace_s: float = 1.0) -> None:
        """At stop, what tasks started and left running (reparented here when their
        worker went) ends with the node, as its workers do: SIGTERM, then SIGKILL after
        ``grace_s``. Without this a task's ``subprocess.Popen`` outlived ``shutdown()``."""
        if not self._subreaper:
            return
        orphans = set(children_of_self())
        for pid in orphans:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while orphans:
            for pid in list(orphans):
                try:
                    done, _ = os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    done = pid
                if done:
                    orphans.discard(pid)
            if not orphans or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        for pid in orphans:
            logger.debug("orphaned process %d did not end on SIGTERM; killing it", pid)
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def _start_fork_server(self) -> None:
        r = self.raylet
        args = self._worker_args()
        cmd = [sys.executable, "-m", "lumos._private.worker.fork_server", str(os.getpid()), "--", *args]
        log = os.path.join(r.session_dir, "logs", f"forkserver-{r.node_id.hex()[:12]}.out")
        self.fork_server = ForkServerClient(cmd, log, self._fork_server_ready, self._forked,
                                            self._fork_server_died, self._exec_env())
        try:
            self.fork_server.start()
        except OSError as e:
            logger.error("could not start the fork server: %s", e)
            self.fork_server = None
            self._apply(self.state.handle(ForkServerDied(), time.monotonic()))

    def _exec_env(self) -> dict[str, str] | None:
        """A worker's (and the fork server's) environment: the raylet's, with glibc's
        non-temporal copy size set (``process.worker_exec_env``)."""
        return worker_exec_env(self.raylet.config.worker_nontemporal_copy_bytes)

    def _worker_args(self) -> list[str]:
        r = self.raylet
        return ["--raylet-socket", r.unix_path,
                "--gcs-address", r.gcs_address,
                "--token-file", os.path.join(r.session_dir, "token"),
                "--session-dir", r.session_dir,
                "--node-id", r.node_id.hex(),
                "--store-dir", r.store_dir,
                "--node-ip", r.node_ip,
                "--config", r.config.to_json(),
                "--parent-pid", str(os.getpid())]

    def _fork_server_ready(self) -> None:
        self.state.handle(ForkServerReady(), time.monotonic())

    def _fork_server_died(self, pending: list[WorkerID]) -> None:
        self.fork_server = None
        if self._stopping:
            return
        self._apply(self.state.handle(ForkServerDied(), time.monotonic()))
        for worker_id in pending:  # asked for, never forked: spawn them instead
            proc = self.procs.get(worker_id)
            if proc is not None and proc.process is None and proc.exit_info is None:
                self._spawn(proc)

    def _restart_fork_server(self) -> None:
        self._restart_handle = None
        if self._stopping:
            return
        self.state.handle(ForkServerRestartDue(), time.monotonic())
        self._start_fork_server()

    def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, StartWorker):
                self._start_new(action.method)
            elif isinstance(action, DeferStart):
                asyncio.get_running_loop().call_later(action.delay_s, self._deferred_start)
            elif isinstance(action, StartForkServer):
                logger.info("restarting the fork server in %.1fs", action.delay_s)
                self._restart_handle = asyncio.get_running_loop().call_later(action.delay_s,
                                                                             self._restart_fork_server)

    # ------------------------------------------------------------------ starting

    def start_worker(self) -> None:
        if not self._stopping:
            self._apply(self.state.handle(StartRequested(), time.monotonic()))

    def _deferred_start(self) -> None:
        if not self._stopping:
            self._apply(self.state.handle(DeferredStartDue(), time.monotonic()))

    def _start_new(self, method: str) -> None:
        worker_id = WorkerID(random_id(16))
        proc = WorkerProc(worker_id, None)
        self.procs[worker_id] = proc
        self.raylet.scheduler.add_starting_worker(worker_id)
        if method == FORK and self.fork_server is not None and \
                self.fork_server.request(worker_id, self._log_path(worker_id), self._gcs_durable()):
            proc.forked = True
            return
        self._spawn(proc)

    def _gcs_durable(self) -> bool | None:
        """Whether the GCS is durable, once the raylet heard it from the GCS (else None)."""
        r = self.raylet
        return r._gcs_durable if r.gcs_durable_known else None

    def _log_path(self, worker_id: WorkerID, suffix: str = "out") -> str:
        return os.path.join(self.raylet.session_dir, "logs", log_name(self.raylet.node_id, worker_id, suffix))

    def _prune_logs(self, exited: WorkerID) -> None:
        """Keep the log files of the last ``worker_logs_kept`` exited workers only."""
        dead = self._dead_logs
        dead.append(exited)
        while len(dead) > self.raylet.config.worker_logs_kept:
            worker_id = dead.popleft()
            for suffix in LOG_SUFFIXES:
                unlink_quietly(self._log_path(worker_id, suffix))

    def _spawn(self, proc: WorkerProc) -> None:
        proc.forked = False
        cmd = [sys.executable, "-m", "lumos._private.worker.main", *self._worker_args(),
               "--worker-id", proc.worker_id.hex()]
        durable = self._gcs_durable()
        if durable is not None:
            cmd += ["--gcs-durable", "1" if durable else "0"]
        try:
            with open(self._log_path(proc.worker_id), "ab") as out:
                popen = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         close_fds=True, start_new_session=False, process_group=0,
                                         env=self._exec_env())
        except OSError as e:
            logger.error("could not start worker %s: %s", short(proc.worker_id), e)
            self._exited(proc, 1, f"could not start: {e}")
            return
        self._attach(proc, popen)

    def _forked(self, worker_id: WorkerID, pid: int | None, error: str) -> None:
        proc = self.procs.get(worker_id)
        if pid is None:
            logger.warning("fork server could not fork worker %s (%s); spawning it", short(worker_id), error)
            if proc is not None and proc.exit_info is None and not self._stopping:
                self._spawn(proc)
            return
        forked = ForkedProcess(int(pid))
        if proc is None or proc.exit_info is not None or self._stopping:
            forked.send_signal(signal.SIGKILL)  # nobody wants it any more
            forked.wait()
            return
        self._attach(proc, forked)

    def _attach(self, proc: WorkerProc, process: Process) -> None:
        if proc.pid and proc.pid != process.pid:
            logger.error("worker %s registered as pid %d but was started as pid %d", short(proc.worker_id),
                         proc.pid, process.pid)
        proc.process = process
        proc.pid = process.pid
        try:
            proc.pidfd = os.pidfd_open(process.pid)
            asyncio.get_running_loop().add_reader(proc.pidfd, self._on_exit, proc.worker_id)
        except (AttributeError, OSError):  # no pidfd: poll from the tick loop instead
            proc.pidfd = -1
        logger.debug("started worker %s pid %d (%s)", short(proc.worker_id), process.pid,
                     "forked" if proc.forked else "spawned")
        if proc.kill_reason:  # killed while it was being forked (or spawned instead)
            process.send_signal(signal.SIGKILL)

    def register_client(self, conn: Connection, msg: m.RegisterClient) -> m.NodeInfo:
        """A worker this raylet started (or a driver) connected: ``RegisterClient``."""
        proc = self.procs.get(msg.worker_id)
        if msg.is_driver:
            proc = WorkerProc(msg.worker_id, None)
            proc.is_driver = True
            proc.pid = msg.pid
            self.procs[msg.worker_id] = proc
        elif proc is None:
            raise PermissionError(f"worker {short(msg.worker_id)} was not started by this raylet")
        elif proc.address is not None:  # e.g. a late fork of a worker that was spawned instead
            raise PermissionError(f"worker {short(msg.worker_id)} is already registered")
        if proc.process is None and not msg.is_driver:
            # Forked, and registering before the fork server's answer (with its pid) was read.
            proc.pid = msg.pid
        proc.conn = conn
        proc.address = msg.address
        proc.job_id = msg.job_id
        conn.peer_info = msg.worker_id
        if not msg.is_driver:
            self.raylet._sched(sc.WorkerRegistered(msg.worker_id))
            self._apply(self.state.handle(WorkerRegistered(), time.monotonic()))
            self.refill()
        self.report_worker(proc, "ALIVE")
        return self.raylet.node_info()

    def refill(self) -> None:
        """Start workers until the pre-started pool is full again: after a worker exits,
        and when one registers (after a streak of workers that died at start, the backoff
        starts one at a time, and the pool is refilled once one of them comes up)."""
        if self._stopping:
            return
        alive = sum(1 for p in self.procs.values() if not p.is_driver)
        for _ in range(self.state.refill_count(alive, self.num_prestart)):
            self.start_worker()

    # ------------------------------------------------------------------ exits

    def tick(self) -> None:
        """Once a second: a stuck fork server is replaced, exits without a pidfd are
        noticed, orphans are reaped."""
        if self.fork_server is not None and self.fork_server.hung(time.monotonic()):
            logger.error("fork server pid %d has not answered for %.0fs; killing it", self.fork_server.pid,
                         FORK_REPLY_TIMEOUT_S)
            self.fork_server.abandon()
        self.poll_exits()
        self.reap_orphans()

    def poll_exits(self) -> None:
        """Workers without a pidfd: notice their exit (from the tick loop)."""
        for proc in list(self.procs.values()):
            if proc.process is not None and proc.pidfd < 0 and proc.exit_info is None \
                    and proc.process.poll() is not None:
                self._on_exit(proc.worker_id)

    def _close_pidfd(self, proc: WorkerProc) -> None:
        if proc.pidfd >= 0:
            try:
                asyncio.get_running_loop().remove_reader(proc.pidfd)
            except (ValueError, RuntimeError):
                pass
            os.close(proc.pidfd)
            proc.pidfd = -1

    def _on_exit(self, worker_id: WorkerID) -> None:
        proc = self.procs.get(worker_id)
        if proc is None or proc.process is None:
            return
        self._close_pidfd(proc)
        code = proc.process.wait()
        self._exited(proc, code, describe_exit(code))

    def _exited(self, proc: WorkerProc, code: int, desc: str) -> None:
        worker_id = proc.worker_id
        if proc.kill_reason:
            desc += f" ({proc.kill_reason})"
        proc.exit_info = desc
        if proc.pid and not proc.is_driver:
            self._dead_groups[proc.pid] = None  # what it started goes too (reap_orphans)
            while len(self._dead_groups) > DEAD_GROUPS_KEPT:
                del self._dead_groups[next(iter(self._dead_groups))]
        self.exits[worker_id] = desc
        if len(self.exits) > 10_000:
            for wid in list(self.exits)[:1000]:
                del self.exits[wid]
        for fut in self.exit_waiters.pop(worker_id, []):
            if not fut.done():
                fut.set_result(desc)
        del self.procs[worker_id]
        if proc.address is not None and proc.address.unix_path:
            unlink_quietly(proc.address.unix_path)  # a killed worker cannot remove its own socket
        level = logging.INFO if proc.kill_reason else logging.WARNING
        logger.log(level, "worker %s pid %d exited: %s", short(worker_id), proc.pid, desc)
        self._prune_logs(worker_id)
        self.report_worker(proc, "DEAD", desc, self._exit_type_of(proc, code))
        for action in self.state.handle(WorkerExited(proc.address is not None,
                                                     bool(proc.kill_reason) or self._stopping, code),
                                        time.monotonic()):
            if isinstance(action, ReportStartFailures):
                logger.error("worker %s exited before registering (%s); %d in a row, next start in %.1fs "
                             "(see logs/worker-%s.out)", short(worker_id), desc, action.in_a_row,
                             action.next_start_in_s, worker_id.hex()[:12])
        self.raylet.worker_exited(proc, desc)
        # Keep the pre-started pool full (also after a job's workers were stopped), but
        # never refill what the idle reaper just trimmed.
        if proc.kill_reason != "idle":
            self.refill()

    async def get_worker_exit(self, conn: Connection, msg: m.GetWorkerExit) -> str | None:
        if msg.worker_id in self.exits:
            return self.exits[msg.worker_id]
        if msg.wait_s <= 0 or msg.worker_id not in self.procs:
            return None
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.exit_waiters.setdefault(msg.worker_id, []).append(fut)
        try:
            async with asyncio.timeout(min(msg.wait_s, 30.0)):
                return await fut
        except TimeoutError:
            return None

    def kill_worker_request(self, conn: Connection, msg: m.KillWorker) -> bool:
        if msg.worker_id not in self.procs:
            return False
        self.stop_worker(msg.worker_id, msg.reason, msg.graceful_s, msg.exit_type, msg.clean_up is not False,
                         force=True)
        return True

    def note_exit_type(self, worker_id: WorkerID, exit_type: str | None) -> None:
        """What the row of a worker that exits on its own is to say of its end."""
        proc = self.procs.get(worker_id)
        if proc is not None and exit_type:
            proc.exit_type = proc.exit_type or exit_type

    def stop_worker(self, worker_id: WorkerID, reason: str, graceful_s: float = 0.0, exit_type: str | None = None,
                    clean_up: bool = True, force: bool = False) -> None:
        """Ask the worker to exit on its own within ``graceful_s`` (``ask_to_exit``) when
        that is above 0 and it can be asked; else kill it (``kill_worker``)."""
        if graceful_s > 0 and self.ask_to_exit(worker_id, reason, graceful_s, exit_type, clean_up):
            return
        self.kill_worker(worker_id, reason, force=force, exit_type=exit_type)

    def ask_to_exit(self, worker_id: WorkerID, reason: str, grace_s: float, exit_type: str | None = None,
                    clean_up: bool = True) -> bool:
        """Ask a worker to exit on its own (``ExitWorker``: an actor runs its clean-up
        first unless not ``clean_up``), and kill it if it is still there after ``grace_s``.
        False when it cannot be asked (not connected, or already going)."""
        proc = self.procs.get(worker_id)
        if proc is None or proc.is_driver or proc.process is None or proc.exit_info is not None \
                or proc.conn is None or proc.conn.is_closed:
            return False
        if not proc.exit_deadline:
            proc.kill_reason = reason or proc.kill_reason
            proc.exit_type = proc.exit_type or exit_type
            proc.exit_deadline = time.monotonic() + grace_s
            proc.conn.notify(m.ExitWorker(reason, clean_up))
            asyncio.get_running_loop().call_later(grace_s, self._exit_overdue, proc)
        return True

    def _exit_overdue(self, proc: WorkerProc) -> None:
        if proc.exit_info is None and self.procs.get(proc.worker_id) is proc:
            logger.info("worker %s did not exit within its grace period; killing it", short(proc.worker_id))
            self.kill_worker(proc.worker_id, proc.kill_reason, force=True)

    async def memory_loop(self) -> None:
        """Sample memory; above the threshold kill one worker (see memory_monitor.py)."""
        import psutil
        r = self.raylet
        interval = r.config.memory_monitor_refresh_ms / 1000
        while True:
            await asyncio.sleep(interval)
            usage = mm.read_memory()  # a few small file reads
            if usage.fraction <= r.memory_monitor.threshold and r.memory_monitor.pending is None:
                continue
            candidates = []
            for w in r.scheduler.workers.values():
                proc = self.procs.get(w.worker_id)
                if w.state != sc.LEASED or proc is None or proc.process is None or proc.exit_info is not None:
                    continue
                try:
                    rss = psutil.Process(proc.pid).memory_info().rss
                except psutil.Error:
                    continue
                kind = mm.ACTOR if w.actor_id else mm.TASK
                candidates.append(mm.Candidate(w.worker_id, proc.pid, kind, w.lease_id, rss,
                                               mm.is_retriable(kind, w.retry_budget)))
            for action in r.memory_monitor.handle(mm.MemorySampled(usage, candidates, time.monotonic())):
                logger.warning("worker %s: %s", short(action.worker_id), action.reason)
                self.kill_worker(action.worker_id, action.reason, force=True,
                                 exit_type=m.WorkerExitType.NODE_OUT_OF_MEMORY)

    def kill_worker(self, worker_id: WorkerID, reason: str, sig: int = signal.SIGKILL, force: bool = False,
                    exit_type: str | None = None) -> None:
        """Signal a worker. One asked to exit on its own (``ask_to_exit``) is left its grace
        period unless ``force``. ``exit_type``: what its row is to say of its end, when the
        first stop that says one (None: ``_exit_type_of`` decides)."""
        proc = self.procs.get(worker_id)
        if proc is None or proc.is_driver or proc.exit_info is not None:
            return
        if proc.exit_deadline and not force and time.monotonic() < proc.exit_deadline:
            return
        if reason:
            proc.kill_reason = reason
        proc.exit_type = proc.exit_type or exit_type
        if proc.process is None:
            proc.kill_reason = proc.kill_reason or "stopped"
            return  # its fork is pending: killed when it arrives
        if proc.process.poll() is not None:
            return
        try:
            proc.process.send_signal(sig)
        except ProcessLookupError:
            pass

    def _exit_type_of(self, proc: WorkerProc, code: int) -> m.WorkerExitType:
        """What an exited worker's row says of its end: what the stop that ended it said;
        else lumos's own stop when this raylet stopped it (or is stopping); else the
        user's when it ended itself with code 0 (``sys.exit()``); else a crash."""
        if proc.exit_type:
            return m.WorkerExitType(proc.exit_type)
        if proc.kill_reason or self._stopping:
            return m.WorkerExitType.INTENDED_SYSTEM_EXIT
        return m.WorkerExitType.INTENDED_USER_EXIT if code == 0 else m.WorkerExitType.SYSTEM_ERROR

    def report_worker(self, proc: WorkerProc, state: str, detail: str = "",
                      exit_type: m.WorkerExitType | None = None) -> None:
        r = self.raylet
        if r.gcs is None or proc.address is None:
            return
        r.gcs.notify(m.ReportWorker(m.WorkerInfo(
            proc.worker_id, r.node_id, proc.pid, proc.address, proc.job_id, proc.is_driver, state,
            time.time(), time.time() if state == "DEAD" else 0.0, detail, exit_type)))

    def reap_orphans(self) -> None:
        """As a child subreaper this raylet inherits every orphaned descendant (a task's
        own subprocess whose worker died, say): one still in a dead worker's process
        group (a worker leads its own) is killed, as Ray ends a worker's child processes
        with it; one that left the group (``setsid``, a daemon) is let be. Wait for those
        that exited, so they do not stay zombies. Known workers and forks still in flight
        are left alone."""
        if not self._subreaper or (self.fork_server is not None and self.fork_server.pending):
            return
        known = {p.pid for p in self.procs.values() if p.process is not None and p.exit_info is None}
        if self.fork_server is not None:
            known.add(self.fork_server.pid)
        for pid in children_of_self():
            if pid in known:
                continue
            if self._dead_groups and _process_group(pid) in self._dead_groups:
                logger.info("killing process %d, which a task on a worker that exited started", pid)
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                logger.debug("reaped orphaned process %d", pid)


def _process_group(pid: int) -> int:
    """``pid``'s process group (-1 if it is gone)."""
    try:
        return os.getpgid(pid)
    except OSError:
        return -1
