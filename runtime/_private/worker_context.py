"""Which core worker this process uses, and the local cluster it started (if any).

The one piece of process-global state behind the public API. Drivers set it in
``lumos.init``; worker processes at start-up.
"""

from __future__ import annotations

import contextvars
import os
import threading
from typing import Any

from lumos._private.core_worker.core_worker import CoreWorker

#: The process's core worker, or None before init / after shutdown.
core_worker: CoreWorker | None = None
#: The call of a threaded or async actor running in this thread or asyncio task (its
#: ``TaskSpec``): such calls run side by side, so ``core_worker.current_task_id`` (the
#: worker's one running task) cannot tell them apart.
current_call: contextvars.ContextVar[Any] = contextvars.ContextVar("lumos_current_call", default=None)
#: Processes started by ``init()`` for a private cluster (driver only).
local_node: Any = None
#: What ``init()`` returned (driver only).
context: Any = None
#: True in worker processes.
is_worker = False
#: Serializes init/shutdown.
lock = threading.RLock()
#: In a process forked from one that had a core worker: that process's pid. The child
#: inherits the core worker's objects but not its threads, and shares its sockets, so it
#: gets none of it (``require`` says why; ``lumos.init()`` connects the child itself).
forked_from: int | None = None

#: Worker ids of the core workers this process shut down (``lumos.shutdown()``): a ref or
#: handle they made, used after, gets an error that says where it came from.
retired_worker_ids: set[bytes] = set()


def earlier_session(owner: Any) -> str:
    """Why this process holds no value for a ref owned by ``owner`` (its owner address)
    when that is a core worker it shut down; "" otherwise."""
    if owner is None or getattr(owner, "worker_id", None) not in retired_worker_ids:
        return ""
    return ("it belongs to an earlier lumos session of this process, ended by lumos.shutdown() "
            "(its value went with that session's cluster)")


_FORKED = ("this process was forked from process {} after it called lumos.init(); lumos's threads "
           "and connections stay with that process, so this one cannot use them. Start child "
           "processes with multiprocessing.get_context('spawn') (and lumos.init() in them), or call "
           "lumos.init() here to start or join a cluster of this process's own")


def _forget_in_forked_child() -> None:
    """After ``os.fork()`` in the child (``multiprocessing``'s default start method on
    Linux): drop the parent's core worker and cluster. Using them here waited for ever (no
    io thread reads the replies), and writing to the shared sockets would corrupt the
    parent's streams; an exit here must not stop the parent's cluster either."""
    global core_worker, local_node, context, forked_from, lock
    if core_worker is not None:
        forked_from = os.getppid()
        core_worker = None
        local_node = None
        context = None
    lock = threading.RLock()  # (another thread of the parent may have held it)


os.register_at_fork(after_in_child=_forget_in_forked_child)


def set_worker_mode(cw: CoreWorker) -> None:
    global core_worker, is_worker
    core_worker = cw
    is_worker = True


def require() -> CoreWorker:
    cw = core_worker
    if cw is None:
        if forked_from is not None:
            raise RuntimeError(_FORKED.format(forked_from))
        raise RuntimeError("lumos is not initialized; call lumos.init() first")
    return cw


def require_or_init() -> CoreWorker:
    """The core worker; starts a local cluster first if needed (as Ray does), except in
    a forked child of a process that used lumos (a new cluster there is not what it meant)."""
    cw = core_worker
    if cw is not None:
        return cw
    if forked_from is not None:
        raise RuntimeError(_FORKED.format(forked_from))
    from lumos import api
    api.init()
    return require()
