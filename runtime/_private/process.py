"""Helpers for lumos's own processes (GCS, raylet, workers): start-up and logging.

Each process entry point calls ``setup_logging`` once (the library never configures the
root logger otherwise) and reports readiness through an inherited pipe
(``report_ready``), so whoever started it learns its address without polling.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux only).

    Services pass SIGTERM: their stop path then still removes sockets and the object
    store when the driver that started them is SIGKILLed.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect


def setup_logging(log_dir: str, name: str, level: int = logging.INFO) -> str:
    """Send this process's log records to ``<log_dir>/<name>.log``."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, f"{name}.log")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    level_name = os.environ.get("LUMOS_LOG_LEVEL")
    if level_name:
        root.setLevel(level_name.upper())
    return path


def report_ready(fd: int, info: dict[str, Any]) -> None:
    """Write ``info`` as one JSON line to the inherited pipe ``fd`` and close it."""
    if fd < 0:
        return
    data = (json.dumps(info) + "\n").encode()
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def await_ready(proc: Any, fd: int, timeout_s: float) -> dict[str, Any] | None:
    """Read the ready line a child writes with ``report_ready``; closes ``fd``.

    Returns the line's JSON, or None when ``proc`` exited (or closed the pipe) first.

    Raises:
        TimeoutError: nothing arrived within ``timeout_s``.
    """
    import select
    import time
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no ready line within {timeout_s:.0f}s")
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(fd)
    if b"\n" not in buf:
        return None
    return json.loads(buf.split(b"\n", 1)[0])  # type: ignore[no-any-return]


def read_token(path: str) -> bytes:
    with open(path, "rb") as f:
        token = f.read().strip()
    if len(token) < 16:
        raise ValueError(f"cluster token in {path} is too short")
    return token


def write_private_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
