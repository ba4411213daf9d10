"""The GCS keeper: restarts a head's GCS that died, when its tables live in Redis.

``lumos start --head --gcs-storage redis://...`` runs the GCS under this small process
instead of on its own. A GCS on durable storage can die (the kernel's OOM killer, a
crash, its storage lost for ``gcs_storage_unavailable_exit_s``) and be started again on
the same address: raylets, workers and drivers wait ``gcs_reconnect_timeout_s`` for
it and go on. Without a keeper someone had to notice and start it by hand in time.

```
lumos start ──spawns──► keeper ──spawns──► GCS (python -m lumos._private.gcs.server)
                          │  its exit: SIGTERM or status 0 ─► the keeper exits too
                          └─ any other exit ─► the same command again, on the port it had
```

What it does not restart: a GCS stopped on purpose (``lumos stop`` signals the keeper,
which passes SIGTERM on; a GCS that exits 0 or on SIGTERM/SIGINT). It gives up, and
exits 1, when the GCS stayed down longer than ``--give-up-s`` (the raylets' and
drivers' reconnect timeout: nobody waits for it after that), or died within
``STABLE_S`` of each of ``CRASH_LOOP`` starts in a row. The current GCS's pid and
start time are in ``<session>/gcs.pid`` (``lumos stop`` ends it through that file too
if the keeper itself was killed). Logs: ``logs/keeper.log``; the GCS's own output
goes where the keeper's does (``logs/gcs.out``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Any

from lumos._private.process import (await_ready, describe_exit, die_with_parent, read_private_file, report_ready,
                                    setup_logging, write_private_file)

logger = logging.getLogger(__name__)

#: The first restart waits this long; each failed start doubles it, up to ``MAX_DELAY_S``.
FIRST_DELAY_S = 0.2
MAX_DELAY_S = 5.0
#: A GCS that ran this long before dying was not crash-looping.
STABLE_S = 30.0
#: Starts in a row each followed by a death within ``STABLE_S``: then the keeper gives up.
CRASH_LOOP = 5
#: How long one start may take to report ready (it reloads its tables from Redis).
START_TIMEOUT_S = 60.0
#: Name of the file holding the running GCS's identity, in the session directory.
PID_FILE = "gcs.pid"


def deliberate_stop(returncode: int) -> bool:
    """An exit the keeper must not undo: a clean stop (0) or a stop signal."""
    return returncode in (0, -signal.SIGTERM, -signal.SIGINT)


class Keeper:
    """Runs one GCS command and starts it again after each death that is not a stop."""

    def __init__(self, session_dir: str, gcs_args: list[str], give_up_s: float) -> None:
        """``gcs_args``: the GCS's module and its arguments (``python -m`` runs them)."""
        self.session_dir = session_dir
        self.gcs_args = list(gcs_args)
        self.give_up_s = give_up_s
        self.pid_file = os.path.join(session_dir, PID_FILE)
        self.proc: subprocess.Popen[bytes] | None = None
        #: Set by SIGTERM/SIGINT: pass it on to the GCS and restart nothing.
        self.stopping = False
        self.restarts = 0

    # ------------------------------------------------------------------ signals

    def on_stop_signal(self, signum: int, frame: Any) -> None:
        self.stopping = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass

    # ------------------------------------------------------------------ one GCS

    def start(self) -> dict[str, Any]:
        """Start the GCS and wait for its ready line. Raises ``RuntimeError`` (it exited
        first) or ``TimeoutError``; either way no GCS of this call is left running."""
        r, w = os.pipe()
        try:
            proc = subprocess.Popen([sys.executable, "-m", *self.gcs_args,
                                     "--ready-fd", str(w)], stdin=subprocess.DEVNULL, pass_fds=(w,),
                                    close_fds=True)
        finally:
            os.close(w)
        self.proc = proc
        if self.stopping:  # the stop signal came before ``self.proc`` was set
            proc.send_signal(signal.SIGTERM)
        try:
            info = await_ready(proc, r, START_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            proc.wait()
            raise TimeoutError(f"the GCS did not start within {START_TIMEOUT_S:.0f}s") from None
        if info is None:
            code = proc.wait()
            raise RuntimeError(f"the GCS exited during start-up ({describe_exit(code)})")
        from lumos._private.node import process_identity
        write_private_file(self.pid_file, json.dumps(process_identity(proc.pid)).encode())
        return info

    def wait(self) -> int:
        """Wait for the running GCS to exit (a stop signal meanwhile is passed on to it by
        ``on_stop_signal``, and the wait goes on); its return code."""
        assert self.proc is not None
        return self.proc.wait()

    # ------------------------------------------------------------------ the loop

    def run(self, ready_fd: int) -> int:
        """Start the GCS (its ready line goes to ``ready_fd``), then keep it up. The
        first start's failure is the caller's to report: nothing is retried then."""
        try:
            info = self.start()
        except (RuntimeError, TimeoutError) as e:
            logger.error("%s", e)
            return 1
        # Restarts listen where the first GCS did (it may have been given port 0).
        self._set_arg("--port", str(info["port"]))
        report_ready(ready_fd, {**info, "keeper_pid": os.getpid()})
        started = time.monotonic()
        short_runs = 0
        while True:
            code = self.wait()
            if self.stopping or deliberate_stop(code):
                logger.info("the GCS stopped (%s); the keeper exits", describe_exit(code))
                self._forget_pid()
                return 0
            down_since = time.monotonic()
            short_runs = short_runs + 1 if down_since - started < STABLE_S else 1
            if short_runs >= CRASH_LOOP:
                logger.error("the GCS died (%s) within %.0fs of each of its last %d starts; not restarting it "
                             "again", describe_exit(code), STABLE_S, short_runs)
                self._forget_pid()
                return 1
            logger.error("the GCS died (%s); restarting it on port %s", describe_exit(code), self._arg("--port"))
            if not self._restart(down_since):
                self._forget_pid()
                return 0 if self.stopping else 1
            started = time.monotonic()

    def _restart(self, down_since: float) -> bool:
        """Start the GCS again until it is up (True), a stop signal came, or it has been
        down ``give_up_s`` (False)."""
        delay = FIRST_DELAY_S
        while True:
            if not self._sleep(delay):
                return False
            if time.monotonic() - down_since > self.give_up_s:
                logger.error("the GCS has been down %.0fs, longer than the cluster waits for it "
                             "(gcs_reconnect_timeout_s); not restarting it", time.monotonic() - down_since)
                return False
            try:
                self.start()
            except (RuntimeError, TimeoutError) as e:
                if self.stopping:
                    return False
                logger.warning("%s; trying again in %.1fs", e, min(delay * 2, MAX_DELAY_S))
                delay = min(delay * 2, MAX_DELAY_S)
                continue
            if self.stopping:  # stopped while it started: it got SIGTERM; let the loop see it end
                return True
            self.restarts += 1
            pid = self.proc.pid if self.proc is not None else 0
            logger.info("the GCS is up again (pid %d, restart %d, down %.1fs)", pid, self.restarts,
                        time.monotonic() - down_since)
            return True

    def _sleep(self, seconds: float) -> bool:
        """Sleep in short slices; False as soon as a stop signal came."""
        end = time.monotonic() + seconds
        while not self.stopping:
            left = end - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.05))
        return False

    def _arg(self, name: str) -> str:
        return self.gcs_args[self.gcs_args.index(name) + 1]

    def _set_arg(self, name: str, value: str) -> None:
        if name in self.gcs_args:
            self.gcs_args[self.gcs_args.index(name) + 1] = value
        else:
            self.gcs_args += [name, value]

    def _forget_pid(self) -> None:
        try:
            os.unlink(self.pid_file)
        except FileNotFoundError:
            pass


def read_gcs_identity(session_dir: str) -> dict[str, Any] | None:
    """The identity (pid, start time) of the GCS a keeper runs in ``session_dir``, or None."""
    try:
        ident = json.loads(read_private_file(os.path.join(session_dir, PID_FILE)))
    except (OSError, ValueError):
        return None
    return ident if isinstance(ident, dict) and isinstance(ident.get("pid"), int) else None


def main() -> None:
    p = argparse.ArgumentParser(prog="lumos-gcs-keeper")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--gcs-args", required=True, help="the GCS's module and arguments, a JSON list")
    p.add_argument("--give-up-s", type=float, default=60.0)
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent, signal.SIGTERM)  # (the keeper then stops its GCS)
    gcs_args = json.loads(args.gcs_args)
    if not isinstance(gcs_args, list) or not all(isinstance(a, str) for a in gcs_args):
        p.error("--gcs-args must be a JSON list of strings")
    setup_logging(os.path.join(args.session_dir, "logs"), "keeper")
    keeper = Keeper(args.session_dir, gcs_args, args.give_up_s)
    signal.signal(signal.SIGTERM, keeper.on_stop_signal)
    signal.signal(signal.SIGINT, keeper.on_stop_signal)
    sys.exit(keeper.run(args.ready_fd))


if __name__ == "__main__":
    main()
