"""Event loops for lumos's own threads and processes.

lumos runs its loops on uvloop when it is installed: on the hot path (a task's round
trip crosses six loop wake-ups) it measured 2.7x faster than the stock asyncio loop
(60 vs 162 us for a bare cross-process, cross-thread echo on 2 cores). The user's own
event loop policy is never changed: the driver's ``lumos-io`` thread gets its own loop.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency on Linux and macOS
    uvloop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    if uvloop is not None:
        return uvloop.new_event_loop()  # type: ignore[no-any-return]
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run`` on a lumos loop (process entry points only)."""
    loop = new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        try:
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in pending:
                t.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
