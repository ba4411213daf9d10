"""Worker output on the driver: the hook a front end uses to route it itself.

Whatever a task prints reaches the driver that owns the job in batches of records,
on the ``lumos-io`` thread. By default each line is printed to the driver's
stdout/stderr with a ``(task_name pid=N)`` prefix; a front end (the notebook
extension sends a ``%%remote`` cell's output into that cell) installs its own handler
and passes on what it does not take to the handler it replaced.

```
 worker print ─► raylet ─► GCS pub/sub "logs" ─► lumos-io thread: handler(records)
                                                    (by default: printed with a prefix)
```

A record is a list ``[job_id, task_id, task_name, pid, is_stderr, text]`` (ids as
bytes, ``text`` one or more lines without the final newline), with a seventh item,
the id of the task's root task (the one the driver submitted), when the task was
nested. A handler runs on the ``lumos-io`` thread: it must return quickly and never
wait on lumos (queue the records for another thread instead).

The handler belongs to this process's connection to its cluster: each ``lumos.init()``
starts with the printing one, so install yours again after a new ``init()``.

Example:
    >>> previous = lumos.util.output.set_handler(lambda records: previous(records))
"""

from __future__ import annotations

from typing import Any, Callable

from lumos._private import worker_context

#: One batch of worker output records (see the module docstring).
OutputHandler = Callable[[list[list[Any]]], None]

__all__ = ["OutputHandler", "get_handler", "set_handler"]


def get_handler() -> OutputHandler | None:
    """The handler worker output goes to now, or None before ``lumos.init()``."""
    cw = worker_context.core_worker
    return None if cw is None else cw.log_handler


def set_handler(handler: OutputHandler) -> OutputHandler:
    """Send this process's worker output to ``handler`` from now on.

    Args:
        handler: called on the ``lumos-io`` thread with each batch of records.

    Returns:
        The handler it replaces: call it with the records yours does not take, and
        give it back to ``set_handler`` to undo.

    Raises:
        TypeError: ``handler`` is not callable.
        RuntimeError: lumos is not initialized in this process.
    """
    if not callable(handler):
        raise TypeError(f"an output handler is a callable taking a list of records, got {type(handler).__name__}")
    cw = worker_context.require()
    previous, cw.log_handler = cw.log_handler, handler
    return previous

