"""Which core worker this process uses, and the local cluster it started (if any).

The one piece of process-global state behind the public API. Drivers set it in
``lumos.init``; worker processes at start-up.
"""

from __future__ import annotations

import threading
from typing import Any

from lumos._private.core_worker.core_worker import CoreWorker

#: The process's core worker, or None before init / after shutdown.
core_worker: CoreWorker | None = None
#: Processes started by ``init()`` for a private cluster (driver only).
local_node: Any = None
#: What ``init()`` returned (driver only).
context: Any = None
#: True in worker processes.
is_worker = False
#: Serializes init/shutdown.
lock = threading.RLock()


def set_worker_mode(cw: CoreWorker) -> None:
    global core_worker, is_worker
    core_worker = cw
    is_worker = True


def require() -> CoreWorker:
    cw = core_worker
    if cw is None:
        raise RuntimeError("lumos is not initialized; call lumos.init() first")
    return cw


def require_or_init() -> CoreWorker:
    """The core worker; starts a local cluster first if needed (as Ray does)."""
    cw = core_worker
    if cw is not None:
        return cw
    from lumos import api
    api.init()
    return require()
