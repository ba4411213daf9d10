"""Starting the head node's dashboard process (``python -m lumos.dashboard``).

Called by ``lumos.init()`` for private clusters (the dashboard dies with the driver,
like the GCS and raylet) and by ``lumos start --head`` (``private=False``: it outlives
the CLI and is stopped with the cluster). The child binds its port (the next free one
when the asked one is busy), writes ``dashboard.json`` into the session directory and
reports ``{"url", "port", "pid"}`` on a pipe; Bokeh is imported only when the first
browser connects, so start-up costs about as much as ``import lumos``.

```
init() ── spawn ──► python -m lumos.dashboard --ready-fd W ... ── {"url": ".../login?token=…"} ──► init()
```
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from lumos._private.process import await_ready


class DashboardStartError(RuntimeError):
    """The dashboard process exited or stayed silent during start-up."""


def spawn_dashboard(session_dir: str, gcs_address: str, token_path: str, host: str = "127.0.0.1",
                    port: int = 8265, *, private: bool = True) -> tuple["subprocess.Popen[bytes]", int]:
    """Start the process; returns it and the read end of its ready pipe (see ``await_dashboard``)."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise ValueError(f"dashboard_port must be an int in 0..65535, got {port!r}")
    if not isinstance(host, str) or not host:
        raise ValueError(f"dashboard_host must be a host name or address, got {host!r}")
    r, w = os.pipe()
    cmd = [sys.executable, "-m", "lumos.dashboard", "--session-dir", session_dir, "--gcs-address", gcs_address,
           "--token-file", token_path, "--host", host, "--port", str(port), "--ready-fd", str(w)]
    if private:
        cmd += ["--die-with-parent", str(os.getpid())]
    os.makedirs(os.path.join(session_dir, "logs"), exist_ok=True)
    log = open(os.path.join(session_dir, "logs", "dashboard.out"), "ab")
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                pass_fds=(w,), close_fds=True, start_new_session=True)  # never in the kernel's group
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
        log.close()
    return proc, r


def await_dashboard(proc: "subprocess.Popen[bytes]", fd: int, session_dir: str,
                    timeout_s: float = 30.0) -> str:
    """Read the ready line; returns the login URL. Closes ``fd``.

    Raises:
        DashboardStartError: the process exited first, or said nothing in ``timeout_s``.
    """
    try:
        info = await_ready(proc, fd, timeout_s)
    except TimeoutError:
        raise DashboardStartError(f"the dashboard did not start within {timeout_s:.0f}s; "
                                  f"see {session_dir}/logs/dashboard.log") from None
    if info is None:
        raise DashboardStartError(f"the dashboard exited during start-up (exit code {proc.poll()}); "
                                  f"see {session_dir}/logs/dashboard.out and dashboard.log")
    return str(info["url"])


def start_dashboard(session_dir: str, gcs_address: str, token_path: str, host: str = "127.0.0.1",
                    port: int = 8265, *, private: bool = True,
                    timeout_s: float = 30.0) -> tuple["subprocess.Popen[bytes]", str]:
    """Start the dashboard and wait until it listens.

    Args:
        session_dir: the head node's session directory (logs, ``dashboard.json``).
        gcs_address: ``"unix:/path/gcs.sock"`` or ``"HOST:PORT"``.
        token_path: the cluster token file.
        host, port: where to listen; a busy ``port`` moves to the next free one.
        private: die with this process (a cluster started by ``init()``); False for
            ``lumos start --head``, whose dashboard outlives the CLI.

    Returns:
        ``(process, login_url)``; the URL carries a login token derived from the
        cluster token (not the token itself).

    Raises:
        ValueError: bad host or port.
        DashboardStartError: the process failed to start.
    """
    proc, fd = spawn_dashboard(session_dir, gcs_address, token_path, host, port, private=private)
    try:
        url = await_dashboard(proc, fd, session_dir, timeout_s)
    except BaseException:
        stop_dashboard(proc)
        raise
    return proc, url


def read_dashboard_url(session_dir: str) -> str:
    """The dashboard's login link from the ``dashboard.json`` it wrote into the head's
    session directory ("" without one: no dashboard, or a directory not this user's)."""
    from lumos._private.process import read_private_file
    if not session_dir:
        return ""
    try:
        return str(json.loads(read_private_file(os.path.join(session_dir, "dashboard.json")))["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def stop_dashboard(proc: "subprocess.Popen[bytes]", timeout_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout_s``; only this process."""
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(timeout_s)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)
