"""The raylet's end of the fork server (``lumos._private.worker.fork_server``).

Owns the fork server's process and control pipes (``ForkServerClient``), and the
Popen-like handle of a worker it forked (``ForkedProcess``). The worker pool
(``worker_pool.py``) is the only caller: it asks for workers, hears of their pids (or of
the server's death) through callbacks, and waits for forked workers as its children,
which they are: cloned with ``CLONE_PARENT``, or double-forked and reparented to the
raylet, a child subreaper (``set_child_subreaper``).

```
WorkerPool ─request(worker id)─► ForkServerClient ─stdin line─► fork server
           ◄─on_forked(id, pid)── (loop reader) ◄─stdout line──┘
           ◄─on_exit(pending ids)─ EOF / hung (FORK_REPLY_TIMEOUT_S) ─ server killed
```
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Union

from lumos._private.ids import WorkerID
from lumos._private.process import describe_exit, libc

logger = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36
#: A fork request unanswered this long means the fork server is stuck: it is replaced.
FORK_REPLY_TIMEOUT_S = 10.0


class ForkedProcess:
    """A worker the fork server forked as this raylet's child: waited for like a
    ``subprocess.Popen`` (``pid``, ``poll``, ``wait``, ``send_signal``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._reap(os.WNOHANG)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            while self.returncode is None:
                self._reap(0)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout)
            time.sleep(0.005)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:
            # Not our child (reaped elsewhere): its status is lost.
            self.returncode = -signal.SIGKILL
            logger.error("worker pid %d was not this raylet's child to wait for", self.pid)
            return
        except InterruptedError:
            return
        if pid:
            self.returncode = os.waitstatus_to_exitcode(status)


Process = Union["subprocess.Popen[bytes]", ForkedProcess]


def set_child_subreaper() -> bool:
    """Make orphaned descendants this process's children (Linux), so it can wait for
    workers the fork server forked. False where the kernel does not allow it."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return bool(libc().prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def children_of_self() -> list[int]:
    """Pids of this process's children, from ``/proc/self/task/*/children``."""
    out: list[int] = []
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.extend(int(p) for p in f.read().split())
        except (OSError, ValueError):
            continue
    return out


class ForkServerClient:
    """The raylet's end of the fork server's control pipes (a child process)."""

    def __init__(self, cmd: list[str], log_path: str, on_ready: Callable[[], None],
                 on_forked: Callable[[WorkerID, int | None, str], None],
                 on_exit: Callable[[list[WorkerID]], None], env: dict[str, str] | None = None) -> None:
        self.cmd = cmd
        #: The server's environment (None: the raylet's own).
        self.env = env
        self.log_path = log_path
        self._on_ready = on_ready
        self._on_forked = on_forked
        self._on_exit = on_exit
        self.popen: subprocess.Popen[bytes] | None = None
        #: Worker ids asked for and not answered yet -> when they were asked (monotonic).
        self.pending: dict[WorkerID, float] = {}
        self._buf = b""
        self._rfd = -1
        self._wfd = -1

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(self.cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                          close_fds=True, start_new_session=False, env=self.env)
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._wfd = self.popen.stdin.fileno()
        self._rfd = self.popen.stdout.fileno()
        os.set_blocking(self._wfd, False)
        os.set_blocking(self._rfd, False)
        asyncio.get_running_loop().add_reader(self._rfd, self._readable)
        logger.info("fork server pid %d started", self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid if self.popen is not None else 0

    def request(self, worker_id: WorkerID, log_path: str, gcs_durable: bool | None = None) -> bool:
        """Ask for a worker; False if the server cannot take it (gone, or its pipe full).
        ``gcs_durable``: whether the GCS keeps its tables in durable storage, when the
        raylet knows it (the worker then does not ask the GCS at start-up)."""
        if self.popen is None or self._wfd < 0:
            return False
        req: dict[str, Any] = {"worker_id": worker_id.hex(), "log": log_path}
        if gcs_durable is not None:
            req["gcs_durable"] = gcs_durable
        data = (json.dumps(req) + "\n").encode()
        try:
            os.write(self._wfd, data)  # one line < PIPE_BUF: written whole or not at all
        except (BlockingIOError, BrokenPipeError):
            return False
        self.pending[worker_id] = time.monotonic()
        return True

    def hung(self, now: float) -> bool:
        """A request has waited longer than ``FORK_REPLY_TIMEOUT_S`` (the server is
        stopped or stuck): give up on it (see ``WorkerPool.tick``)."""
        oldest = next(iter(self.pending.values()), None)
        return oldest is not None and now - oldest > FORK_REPLY_TIMEOUT_S

    def abandon(self) -> None:
        """Kill the server and handle it as dead (its pending workers get spawned)."""
        self._gone()

    def _readable(self) -> None:
        try:
            data = os.read(self._rfd, 65536)
        except BlockingIOError:
            return
        except OSError as e:
            logger.error("reading from the fork server failed: %s", e)
            data = b""
        if not data:
            self._gone()
            return
        self._buf += data
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
                if "ready" in msg:
                    logger.info("fork server ready (workers %s)%s",
                                "cloned as this raylet's children" if msg.get("clone") else "double-forked",
                                f", {', '.join(msg['preloaded'])} imported" if msg.get("preloaded") else "")
                    if msg.get("failed"):
                        logger.warning("fork server could not import %s (worker_preload_modules)",
                                       "; ".join(map(str, msg["failed"])))
                    self._on_ready()
                    continue
                if "warmed" in msg:
                    logger.info("fork server pre-imported %s", ", ".join(msg["warmed"]) or "nothing more")
                    continue
                worker_id = WorkerID(bytes.fromhex(msg["worker_id"]))
            except (ValueError, KeyError, TypeError) as e:
                logger.error("bad line from the fork server %r: %s", line[:200], e)
                continue
            self.pending.pop(worker_id, None)
            self._on_forked(worker_id, msg.get("pid"), str(msg.get("error", "")))

    def _gone(self) -> None:
        popen = self.popen
        self.close()
        code = popen.poll() if popen is not None else None
        logger.warning("fork server pid %d exited (%s); spawning workers until it is back",
                       popen.pid if popen else 0, "running" if code is None else describe_exit(code))
        pending = list(self.pending)
        self.pending.clear()
        self._on_exit(pending)

    def close(self, timeout_s: float = 2.0) -> None:
        """Stop the server (closing its stdin ends it; SIGKILL if it lingers) and reap it."""
        popen, self.popen = self.popen, None
        if self._rfd >= 0:
            try:
                asyncio.get_running_loop().remove_reader(self._rfd)
            except RuntimeError:
                pass
        self._rfd = self._wfd = -1
        if popen is None:
            return
        if popen.poll() is None:
            popen.kill()
        try:
            popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.error("fork server pid %d did not exit", popen.pid)
        for f in (popen.stdin, popen.stdout):
            if f is not None:
                try:
                    f.close()
                except OSError:
                    pass
