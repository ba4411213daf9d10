"""Ray's ``ray.util.as_completed`` and ``ray.util.map_unordered``: results as they finish.

    for value in lumos.util.as_completed([f.remote(x) for x in xs], chunk_size=2):
        print(value)
    for value in lumos.util.map_unordered(f, range(1000), backpressure_size=50):
        print(value)
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from lumos.object_ref import ObjectRef


def as_completed(refs: Sequence[ObjectRef], *, chunk_size: int = 10, yield_obj_refs: bool = False,
                 **kwargs: Any) -> Iterator[Any]:
    """Yield the values (or refs) of ``refs`` in batches of up to ``chunk_size`` as they
    finish, instead of waiting for all of them.

    Args:
        refs: refs of submitted tasks.
        chunk_size: how many to wait for at a time (``num_returns`` of ``lumos.wait``).
        yield_obj_refs: yield the refs themselves instead of their values.
        **kwargs: passed to ``lumos.wait`` (``timeout``, ``fetch_local``).

    Raises:
        ValueError: ``chunk_size < 1``, or ``num_returns`` given.
    """
    from lumos.api import get, wait
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError("chunk_size must be an int >= 1")
    if "num_returns" in kwargs:
        raise ValueError("use chunk_size=... instead of num_returns")
    pending = list(refs)
    while pending:
        ready, pending = wait(pending, num_returns=min(chunk_size, len(pending)), **kwargs)
        if yield_obj_refs:
            yield from ready
        else:
            yield from get(ready)


def map_unordered(fn: Any, items: Iterable[Any], *, backpressure_size: int | None = 100, chunk_size: int = 10,
                  yield_obj_refs: bool = False, **kwargs: Any) -> Iterator[Any]:
    """Run the remote function ``fn`` on each item, at most ``backpressure_size`` at once,
    and yield the results as they finish (in any order).

    Args:
        fn: a remote function (``@lumos.remote``).
        items: the arguments, one call each.
        backpressure_size: calls in flight at most (None: no limit).
        chunk_size: results waited for at a time.
        yield_obj_refs: yield refs instead of values.
        **kwargs: passed to ``lumos.wait``.
    """
    from lumos.remote_function import RemoteFunction
    if not isinstance(fn, RemoteFunction) and not hasattr(fn, "remote"):
        raise TypeError("map_unordered() needs a remote function (decorated with @lumos.remote)")
    if backpressure_size is not None and (not isinstance(backpressure_size, int) or backpressure_size < 1):
        raise ValueError("backpressure_size must be None or an int >= 1")
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError("chunk_size must be an int >= 1")
    from lumos.api import get, wait
    in_flight: list[ObjectRef] = []
    for item in items:
        in_flight.append(fn.remote(item))
        if backpressure_size is not None and len(in_flight) >= backpressure_size:
            ready, in_flight = wait(in_flight, num_returns=min(chunk_size, len(in_flight)), **kwargs)
            yield from (ready if yield_obj_refs else get(ready))
    yield from as_completed(in_flight, chunk_size=chunk_size, yield_obj_refs=yield_obj_refs, **kwargs)


__all__ = ["as_completed", "map_unordered"]
