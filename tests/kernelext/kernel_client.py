"""A kernel driven the way JupyterLab drives it: ``jupyter_client``'s KernelManager.

nbclient never interrupts; JupyterLab's stop button calls ``KernelManager.interrupt_kernel()``,
which signals the kernel's whole process group. ``DirectKernel`` runs cells, can interrupt
one once its output shows a marker, and collects each cell's iopub messages.
"""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from jupyter_client.manager import KernelManager


def lumos_cli(root: str, *args: str) -> str:
    """Run ``lumos ARGS`` with its session root at ``root`` and no cluster inherited from the
    environment; returns its output, failing the test if it fails."""
    env = dict(os.environ, LUMOS_TMPDIR=root)
    env.pop("LUMOS_ADDRESS", None)
    env.pop("LUMOS_CLUSTER_TOKEN", None)
    done = subprocess.run([sys.executable, "-m", "lumos.cli", *args], env=env, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@dataclass
class CellRun:
    """What one execute request produced on iopub."""

    stdout: str = ""
    stderr: str = ""
    errors: list[dict[str, Any]] = field(default_factory=list)
    results: list[dict[str, Any]] = field(default_factory=list)
    displays: list[dict[str, Any]] = field(default_factory=list)
    execution_count: int | None = None

    def traceback(self) -> str:
        return "\n".join(line for e in self.errors for line in e["traceback"])


#: Kernel starts tried before a test fails (see ``DirectKernel``).
KERNEL_START_ATTEMPTS = 3


class DirectKernel:
    """A kernel started as JupyterLab starts one: TCP on loopback, on ports
    ``jupyter_client`` picked free. Another process can take such a port before the kernel
    binds it (the kernel then dies at start with "Address already in use"); a start that
    dies before its first reply is tried again, its sockets closed first (left to the
    garbage collector, they were reported against whichever test ran next)."""

    def __init__(self, cwd: str, env: dict[str, str] | None = None) -> None:
        full_env = dict(os.environ)
        full_env.pop("LUMOS_ADDRESS", None)
        full_env.update(env or {})
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            self.km = KernelManager(kernel_name="python3")
            self.km.start_kernel(cwd=cwd, env=full_env)
            self.kc = self.km.client()
            self.kc.start_channels()
            try:
                self.kc.wait_for_ready(60)
                return
            except RuntimeError as e:
                self.close(now=True)
                if attempt == KERNEL_START_ATTEMPTS or "died" not in str(e):
                    raise

    def run(self, code: str, timeout_s: float = 60.0, interrupt_on: str | None = None,
            interrupt_after_s: float = 0.0) -> CellRun:
        """Execute ``code``; with ``interrupt_on``, press stop ``interrupt_after_s`` after
        stdout first contains it."""
        msg_id = self.kc.execute(code)
        out = CellRun()
        interrupted = False
        seen_at: float | None = None
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"cell did not finish within {timeout_s}s: {code[:80]!r}; so far {out}")
            try:
                msg = self.kc.get_iopub_msg(timeout=min(left, 0.05))
            except queue.Empty:
                msg = None
            if interrupt_on is not None and not interrupted and seen_at is not None \
                    and time.monotonic() >= seen_at + interrupt_after_s:
                interrupted = True
                self.km.interrupt_kernel()
            if msg is None:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                if content["name"] == "stdout":
                    out.stdout += content["text"]
                else:
                    out.stderr += content["text"]
            elif kind == "error":
                out.errors.append(content)
            elif kind == "execute_result":
                out.results.append(content["data"])
            elif kind == "display_data":
                out.displays.append(content["data"])
            elif kind == "execute_input":
                out.execution_count = content["execution_count"]
            elif kind == "status" and content["execution_state"] == "idle":
                return out
            if interrupt_on is not None and seen_at is None and interrupt_on in out.stdout:
                seen_at = time.monotonic()

    def ok(self, code: str, timeout_s: float = 60.0) -> CellRun:
        """Run ``code`` and fail the test on an error."""
        out = self.run(code, timeout_s)
        assert not out.errors, f"cell failed: {code[:80]!r}\n{out.traceback()}"
        return out

    def close(self, now: bool = False) -> None:
        try:
            self.kc.stop_channels()
        finally:
            self.km.shutdown_kernel(now=now)

    def shut_down(self) -> None:
        """``lumos.shutdown()`` in the kernel (30 s at most), then ``close``, whatever happens."""
        try:
            self.run("lumos.shutdown()", timeout_s=30)
        finally:
            self.close()


def shut_down_all(k: "DirectKernel | None", root: str) -> None:
    """``k.shut_down()`` (when there is a kernel), then ``lumos stop`` of the cluster at
    ``root``, whatever happens."""
    try:
        if k is not None:
            k.shut_down()
    finally:
        lumos_cli(root, "stop")
