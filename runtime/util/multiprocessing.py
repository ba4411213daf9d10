"""``Pool``: the stdlib ``multiprocessing.Pool`` API on lumos actors (Ray's
``ray.util.multiprocessing``).

    from lumos.util.multiprocessing import Pool

    with Pool(processes=2) as pool:
        pool.map(square, range(10))        # [0, 1, 4, ..., 81]

Owns a pool's actors and the two kinds of helper thread below; the user's code calls it.
Each of ``processes`` actors runs ``initializer(*initargs)`` once, then runs chunks: one
actor call applies ``func`` to a list of items and returns the list of results. A chunk
goes to the actor with the fewest chunks in flight.

    caller ── map_async / apply_async ──► actor.run_chunk.remote() ──► ObjectRef.future()
                                                                              │ resolved
    AsyncResult / IMapIterator ◄── results stored, waiters woken (any thread) ◄┘
    lumos-pool-results: runs callback / error_callback one at a time, in arrival order;
        once the pool is closed and nothing is in flight, kills the actors and exits.
    lumos-pool-feeder (one per imap call): reads the iterable and submits its chunks, so
        imap returns at once and a slow generator streams.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future
from functools import partial
from multiprocessing import TimeoutError  # Ray's module exports it; it shadows the builtin here
from typing import Any, Callable, Iterable, Iterator, cast

from lumos import api
from lumos.actor import ActorClass, ActorHandle, kill
from lumos.exceptions import ActorDiedError

logger = logging.getLogger(__name__)

# Pool states, named as in the stdlib.
_RUN = "RUN"
_CLOSE = "CLOSE"
_TERMINATE = "TERMINATE"

#: After this long waiting for its actors to start, a pool logs why it may be stuck.
_START_WARN_S = 10.0
#: How long ``terminate()`` waits for in-flight chunks to fail and callbacks to finish.
_TERMINATE_WAIT_S = 30.0


class PoolActor:
    """One process of a ``Pool``: runs the initializer once, then chunks of work."""

    def __init__(self, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
        if initializer is not None:
            initializer(*initargs)

    def ready(self) -> None:
        """Returns once the initializer has run (the pool waits on it at start)."""

    def run_chunk(self, func: Callable[..., Any], items: list[Any], star: bool) -> list[Any]:
        """``func`` over ``items`` (``func(*item)`` with ``star``), in order."""
        if star:
            return [func(*args) for args in items]
        return [func(x) for x in items]

    def run_one(self, func: Callable[..., Any], args: tuple[Any, ...], kwds: dict[str, Any]) -> Any:
        """``func(*args, **kwds)`` (``apply``)."""
        return func(*args, **kwds)


_POOL_ACTOR = ActorClass(PoolActor, {})


class _ResultHandler:
    """Owns the ``lumos-pool-results`` thread and, from the pool's start, its actors.

    Runs user callbacks one at a time, in order, off the ``lumos-io`` thread (a callback
    may call lumos). On ``stop()`` it finishes what is queued, kills the actors and exits.
    Holds no reference to the ``Pool``, so a dropped pool can be collected (its finalizer
    calls ``stop()``).
    """

    def __init__(self, actors: list[ActorHandle]) -> None:
        #: Callables to run; ``None`` stops the thread.
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        #: The pool's actors until they are killed (then empty).
        self._actors = actors
        self._actors_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="lumos-pool-results", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the results thread, after everything queued before it."""
        self._queue.put(fn)

    def stop(self) -> None:
        """Finish the queued callbacks, then kill the actors and exit."""
        self._queue.put(None)

    def kill_actors(self) -> None:
        """Kill the actors now (once; later calls do nothing)."""
        with self._actors_lock:
            actors, self._actors = self._actors, []
        if not actors or not api.is_initialized():  # after lumos.shutdown() they are gone already
            return
        for actor in actors:
            kill(actor)
        logger.debug("killed %d pool actors", len(actors))

    def _run(self) -> None:
        while True:
            fn = self._queue.get()
            if fn is None:
                break
            try:
                fn()
            except Exception:
                logger.exception("a Pool callback raised; the pool carries on")
        try:
            self.kill_actors()
        except Exception:
            logger.exception("could not kill the pool's actors; they end with the job")


class AsyncResult:
    """The result of ``apply_async``, ``map_async`` or ``starmap_async`` (the stdlib's
    ``AsyncResult``). Made by the pool, not by users.

    Example:
        >>> r = pool.map_async(square, range(4))
        >>> r.get(timeout=10)
        [0, 1, 4, 9]
    """

    def __init__(self, handler: _ResultHandler, num_chunks: int, single: bool,
                 callback: Callable[[Any], Any] | None,
                 error_callback: Callable[[BaseException], Any] | None) -> None:
        self._handler = handler
        self._single = single
        self._callback = callback
        self._error_callback = error_callback
        self._lock = threading.Lock()
        #: Set once the value (or error) is final and its callback has run.
        self._event = threading.Event()
        #: Chunk index -> that chunk's results, until all arrive.
        self._chunks: list[Any] = [None] * num_chunks
        self._remaining = num_chunks
        #: None while pending; then whether it succeeded.
        self._success: bool | None = None
        #: The value, or the first error.
        self._value: Any = None

    def get(self, timeout: float | None = None) -> Any:
        """The result, waiting up to ``timeout`` seconds.

        Returns:
            ``func``'s return value (``apply_async``) or the list of results in input order
            (``map_async``, ``starmap_async``).

        Raises:
            multiprocessing.TimeoutError: not ready within ``timeout``; call again to wait on.
            Exception: the first exception ``func`` raised, as an instance of its own class
                (a ``lumos.exceptions.TaskError`` carrying the remote traceback), or
                ``ActorDiedError`` if the pool was terminated first.
        """
        if not self._event.wait(timeout):
            raise TimeoutError(f"the result was not ready within {timeout}s; call get() again to keep waiting")
        if self._success:
            return self._value
        raise self._value

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is ready or ``timeout`` seconds pass (never raises)."""
        self._event.wait(timeout)

    def ready(self) -> bool:
        """Whether the call has finished (and its callback has run)."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call finished without raising.

        Raises:
            ValueError: the result is not ready yet.
        """
        if not self._event.is_set():
            raise ValueError(f"{self!r} not ready")
        return bool(self._success)

    def __repr__(self) -> str:
        state = "pending" if self._success is None else ("ok" if self._success else "failed")
        return f"<lumos.util.multiprocessing.AsyncResult {state}>"

    def _chunk_done(self, index: int, fut: Future[Any]) -> None:
        """A chunk resolved (runs on whichever thread resolved it)."""
        error = fut.exception()
        with self._lock:
            if self._success is not None:  # an earlier chunk failed: the result is final
                return
            if error is not None:
                self._success, self._value = False, error
            else:
                self._chunks[index] = fut.result()
                self._remaining -= 1
                if self._remaining:
                    return
                self._success = True
                self._value = (self._chunks[0] if self._single
                               else list(itertools.chain.from_iterable(self._chunks)))
                self._chunks = []
        self._finish()

    def _set_empty(self) -> None:
        """A map over no items: ``[]`` at once (the callback still runs, as in Ray)."""
        with self._lock:
            self._success, self._value = True, []
        self._finish()

    def _finish(self) -> None:
        wanted = self._callback if self._success else self._error_callback
        if wanted is None:
            self._event.set()
        else:
            self._handler.call(partial(self._run_callback, wanted))

    def _run_callback(self, callback: Callable[[Any], Any]) -> None:
        try:
            callback(self._value)
        finally:  # a failing callback is logged by the handler; get() still returns
            self._event.set()


class IMapIterator:
    """The iterator ``imap`` returns: results in input order, as they arrive. Made by the
    pool, not by users.

    Example:
        >>> for y in pool.imap(square, range(4)):
        ...     print(y)
    """

    #: Yield chunks as they finish rather than in input order.
    _unordered = False

    def __init__(self) -> None:
        self._cond = threading.Condition()
        #: Chunk futures in submission order (None once consumed).
        self._futures: list[Future[Any] | None] = []
        #: Unordered: indices of resolved chunks not yet returned.
        self._resolved: deque[int] = deque()
        #: Chunks handed to the consumer so far (ordered: also the next index).
        self._consumed = 0
        #: Results of the current chunk still to return.
        self._buffer: deque[Any] = deque()
        #: The feeder has submitted every chunk it will.
        self._fed_all = False
        #: Why the feeder stopped early (the iterable raised, the pool was terminated).
        self._feed_error: BaseException | None = None

    def __iter__(self) -> IMapIterator:
        return self

    def __next__(self) -> Any:
        return self.next()

    def next(self, timeout: float | None = None) -> Any:
        """The next result, waiting up to ``timeout`` seconds.

        Raises:
            StopIteration: every result has been returned.
            multiprocessing.TimeoutError: none ready within ``timeout``; call again to wait on.
            Exception: what ``func`` raised for an item of this chunk (the chunk's other
                results are lost; iteration can go on with the next chunk).
        """
        if self._buffer:
            return self._buffer.popleft()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                index = self._ready_index()
                if index is not None:
                    break
                if self._fed_all and self._consumed == len(self._futures):
                    error, self._feed_error = self._feed_error, None
                    if error is not None:
                        raise error
                    raise StopIteration
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no result within {timeout}s; call next() again to keep waiting")
                self._cond.wait(remaining)
            self._consumed += 1
            fut = cast("Future[Any]", self._futures[index])
            self._futures[index] = None
        error = fut.exception()
        if error is not None:
            raise error
        self._buffer.extend(fut.result())
        return self._buffer.popleft()

    def _ready_index(self) -> int | None:
        if self._unordered:
            return self._resolved.popleft() if self._resolved else None
        i = self._consumed
        if i < len(self._futures):
            fut = self._futures[i]
            if fut is not None and fut.done():
                return i
        return None

    def _add(self, fut: Future[Any]) -> None:
        """The feeder submitted the next chunk."""
        with self._cond:
            index = len(self._futures)
            self._futures.append(fut)
        fut.add_done_callback(partial(self._chunk_done, index))

    def _chunk_done(self, index: int, fut: Future[Any]) -> None:
        with self._cond:
            if self._unordered:
                self._resolved.append(index)
            self._cond.notify_all()

    def _feed_finished(self, error: BaseException | None) -> None:
        with self._cond:
            self._fed_all = True
            self._feed_error = error
            self._cond.notify_all()


class IMapUnorderedIterator(IMapIterator):
    """The iterator ``imap_unordered`` returns: results in the order they finish."""

    _unordered = True


class Pool:
    """A pool of lumos actors with the stdlib ``multiprocessing.Pool`` API (Ray's
    ``ray.util.multiprocessing.Pool``).

    Work is split into chunks; each chunk is one actor call that runs ``func`` over its
    items. The actors are placed like any actor (a CPU must be free to place one, none is
    held while it runs, as in Ray), so a pool never starves the tasks ``func`` starts;
    ``ray_remote_args={"num_cpus": 1}`` makes each actor hold a CPU instead.

    Args:
        processes: number of actors; default: the cluster's CPU count.
        initializer: run as ``initializer(*initargs)`` once in each actor as it starts.
        initargs: arguments for ``initializer``.
        maxtasksperchild: accepted for compatibility and ignored: actors are not replaced.
        context: accepted for compatibility and ignored (there are no local processes).
        ray_address: cluster to connect to when lumos is not initialized yet; without it
            a local cluster is started with ``processes`` CPUs. Ignored once initialized.
        ray_remote_args: options for the actors, as for ``.options()`` (``num_cpus``,
            ``num_gpus``, ``resources``, ``runtime_env``, ``scheduling_strategy``, ...).

    Raises:
        ValueError: ``processes`` < 1.
        TypeError: an argument has the wrong type (``initializer`` not callable, ...).
        Exception: what ``initializer`` raised in an actor (the pool is not started).

    Example:
        >>> from lumos.util.multiprocessing import Pool
        >>> with Pool(processes=2) as pool:
        ...     pool.map(abs, [-1, -2, 3])
        [1, 2, 3]
    """

    def __init__(self, processes: int | None = None, initializer: Callable[..., Any] | None = None,
                 initargs: Iterable[Any] | None = None, maxtasksperchild: int | None = None,
                 context: Any = None, ray_address: str | None = None,
                 ray_remote_args: dict[str, Any] | None = None) -> None:
        if processes is not None and (isinstance(processes, bool) or not isinstance(processes, int)):
            raise TypeError(f"processes must be an int or None, not {type(processes).__name__}")
        if processes is not None and processes < 1:
            raise ValueError(f"Number of processes must be at least 1, got {processes}")
        if initializer is not None and not callable(initializer):
            raise TypeError(f"initializer must be a callable, not {type(initializer).__name__}")
        init_args = tuple(initargs) if initargs is not None else ()
        if maxtasksperchild is not None and (isinstance(maxtasksperchild, bool)
                                             or not isinstance(maxtasksperchild, int) or maxtasksperchild < 1):
            raise ValueError(f"maxtasksperchild must be a positive int or None, got {maxtasksperchild!r}")
        if ray_remote_args is not None and not isinstance(ray_remote_args, dict):
            raise TypeError(f"ray_remote_args must be a dict of actor options, not {type(ray_remote_args).__name__}")
        remote_args = dict(ray_remote_args or {})

        if not api.is_initialized():
            if ray_address is not None:
                api.init(address=ray_address)
            else:
                api.init(num_cpus=processes)
        total_cpus = api.cluster_resources().get("CPU", 0)
        if processes is None:
            processes = int(total_cpus)
            if processes < 1:
                raise ValueError("the cluster has no CPUs to size the pool by; pass processes=N")

        self._lock = threading.Lock()
        #: Serializes actor calls, so each actor receives its chunks in submission order.
        self._submit_lock = threading.Lock()
        self._state = _RUN
        #: Chunks submitted (or reserved) and not yet resolved.
        self._in_flight = 0
        #: imap feeder threads still reading their iterable.
        self._feeding = 0
        #: The results thread has been told to stop.
        self._stop_sent = False

        actor_class = _POOL_ACTOR.options(**remote_args)
        actors: list[ActorHandle] = []
        try:
            for _ in range(processes):
                actors.append(actor_class.remote(initializer, init_args))
            refs = [a.ready.remote() for a in actors]
            _, pending = api.wait(refs, num_returns=len(refs), timeout=_START_WARN_S)
            if pending:
                logger.warning("Pool: %d of %d actors have not started after %.0fs; their resources "
                               "(%s) may be held by other work", len(pending), len(refs), _START_WARN_S,
                               remote_args or "one CPU to place each")
            try:
                api.get(refs)
            except ActorDiedError as e:
                if e.cause is None:
                    raise
                # The initializer raised: the pool raises that, as documented above.
                raise e.cause from None
        except BaseException:
            if api.is_initialized():
                for a in actors:
                    kill(a)
            raise
        self._actors = actors
        #: Chunks in flight per actor, for picking the least busy one.
        self._load = [0] * processes
        self._next_actor = 0
        self._handler = _ResultHandler(list(actors))
        self._handler.start()
        # A pool dropped without close()/terminate() still stops its thread and actors.
        self._finalizer = weakref.finalize(self, self._handler.stop)
        self._finalizer.atexit = False
        logger.debug("started a Pool of %d actors (%s)", processes, remote_args)

    # ------------------------------------------------------------------ apply

    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: dict[str, Any] | None = None) -> Any:
        """``func(*args, **kwds)`` on one of the actors; waits for the result.

        Raises:
            ValueError: the pool is closed or terminated.
            TypeError: ``func`` is not callable.
            Exception: what ``func`` raised, as an instance of its own class.
        """
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: dict[str, Any] | None = None,
                    callback: Callable[[Any], Any] | None = None,
                    error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        """Start ``func(*args, **kwds)`` on one of the actors.

        Args:
            callback: called with the result when it arrives (in this process, on the
                pool's results thread).
            error_callback: called with the exception instead, if ``func`` raised.

        Returns:
            An ``AsyncResult``.

        Raises:
            ValueError: the pool is closed or terminated.
            TypeError: ``func`` or a callback is not callable.
        """
        self._check_running()
        _check_callables(func, callback, error_callback)
        call_args = tuple(args) if args is not None else ()
        call_kwds = dict(kwds) if kwds is not None else {}
        result = AsyncResult(self._handler, 1, True, callback, error_callback)
        self._reserve(1)
        self._send_counted("run_one", (func, call_args, call_kwds), partial(result._chunk_done, 0))
        return result

    # ------------------------------------------------------------------ map

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int | None = None) -> list[Any]:
        """``[func(x) for x in iterable]``, run over the actors; waits for all results.

        Args:
            chunksize: items per actor call; default: about four chunks per actor.

        Raises:
            ValueError: the pool is closed or terminated, or ``chunksize`` < 1.
            TypeError: ``func`` is not callable or ``iterable`` is not iterable.
            Exception: the first exception ``func`` raised, as an instance of its own class.
        """
        return self._map_async(func, iterable, chunksize, False, None, None).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int | None = None,
                  callback: Callable[[list[Any]], Any] | None = None,
                  error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        """Start ``map``; ``callback`` gets the whole list, ``error_callback`` the first
        exception.

        Returns:
            An ``AsyncResult`` whose ``get()`` is the list of results.
        """
        return self._map_async(func, iterable, chunksize, False, callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: int | None = None) -> list[Any]:
        """``[func(*args) for args in iterable]``, run over the actors; as ``map``."""
        return self._map_async(func, iterable, chunksize, True, None, None).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: int | None = None, callback: Callable[[list[Any]], Any] | None = None,
                      error_callback: Callable[[BaseException], Any] | None = None) -> AsyncResult:
        """Start ``starmap``; as ``map_async``."""
        return self._map_async(func, iterable, chunksize, True, callback, error_callback)

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any], chunksize: int | None, star: bool,
                   callback: Callable[[Any], Any] | None,
                   error_callback: Callable[[BaseException], Any] | None) -> AsyncResult:
        self._check_running()
        _check_callables(func, callback, error_callback)
        _check_chunksize(chunksize, allow_none=True)
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), len(self._actors) * 4)  # the stdlib's choice
            if extra or not chunksize:
                chunksize += 1
        chunks = [items[i:i + chunksize] for i in range(0, len(items), chunksize)]
        result = AsyncResult(self._handler, len(chunks), False, callback, error_callback)
        if not chunks:
            with self._lock:  # under the lock: a concurrent close() cannot stop the handler first
                self._check_running()
                result._set_empty()
            return result
        self._reserve(len(chunks))
        for i, chunk in enumerate(chunks):
            try:
                self._send_counted("run_chunk", (func, chunk, star), partial(result._chunk_done, i))
            except BaseException:
                self._release(len(chunks) - i - 1)  # _send_counted released chunk i itself
                raise
        return result

    # ------------------------------------------------------------------ imap

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1) -> IMapIterator:
        """``func`` over ``iterable``, yielding results in input order as they arrive.

        Returns at once: a ``lumos-pool-feeder`` thread reads ``iterable`` and submits its
        chunks (work the pool accepted goes on after ``close()``).

        Raises:
            ValueError: the pool is closed or terminated, or ``chunksize`` < 1.
            TypeError: ``func`` is not callable or ``iterable`` is not iterable.
        """
        return self._imap(func, iterable, chunksize, unordered=False)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator:
        """As ``imap``, but yields results in the order they finish."""
        return self._imap(func, iterable, chunksize, unordered=True)

    def _imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int,
              unordered: bool) -> IMapIterator:
        self._check_running()
        _check_callables(func, None, None)
        _check_chunksize(chunksize, allow_none=False)
        source = iter(iterable)
        result = IMapUnorderedIterator() if unordered else IMapIterator()
        with self._lock:
            if self._state != _RUN:
                raise ValueError("Pool not running")
            self._feeding += 1
        threading.Thread(target=self._feed, args=(result, func, source, chunksize), name="lumos-pool-feeder",
                         daemon=True).start()
        return result

    def _feed(self, result: IMapIterator, func: Callable[[Any], Any], source: Iterator[Any],
              chunksize: int) -> None:
        error: BaseException | None = None
        try:
            while True:
                chunk = list(itertools.islice(source, chunksize))
                if not chunk:
                    break
                self._reserve(1, accepted=True)
                result._add(self._send_counted("run_chunk", (func, chunk, False), None))
        except Exception as e:  # the iterable raised, or the pool was terminated: next() raises it
            error = e
        finally:
            result._feed_finished(error)
            with self._lock:
                self._feeding -= 1
                stop = self._stop_due()
            if stop:
                self._handler.stop()

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Accept no more work; the actors exit once the work already given is done."""
        with self._lock:
            if self._state == _RUN:
                self._state = _CLOSE
            stop = self._stop_due()
        if stop:
            self._handler.stop()

    def terminate(self) -> None:
        """Kill the actors now. Results still pending raise ``ActorDiedError``; their
        error callbacks run before this returns."""
        with self._lock:
            self._state = _TERMINATE
            stop = self._stop_due()
        if stop:
            self._handler.stop()
        self._handler.kill_actors()
        if threading.current_thread() is self._handler.thread:  # called from a callback
            return
        self._handler.thread.join(_TERMINATE_WAIT_S)
        if self._handler.thread.is_alive():
            logger.warning("Pool.terminate(): a callback or an imap iterable is still running after %.0fs; "
                           "the pool's results thread stops once it returns", _TERMINATE_WAIT_S)

    def join(self) -> None:
        """Wait until the work given to a closed pool is done, its callbacks have run and
        its actors are gone (after ``terminate()``: until they are killed).

        Raises:
            ValueError: the pool is still running (call ``close()`` or ``terminate()`` first).
            RuntimeError: called from a pool callback, which would wait for itself.
        """
        if self._state == _RUN:
            raise ValueError("Pool is still running; call close() or terminate() before join()")
        if threading.current_thread() is self._handler.thread:
            raise RuntimeError("join() cannot be called from a Pool callback: the callback thread would "
                               "wait for itself")
        self._handler.thread.join()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.terminate()

    def __reduce__(self) -> Any:
        raise NotImplementedError("a Pool cannot be pickled or passed to tasks or actors; "
                                  "create it where it is used")

    def __repr__(self) -> str:
        return f"<lumos.util.multiprocessing.Pool state={self._state} pool_size={len(self._actors)}>"

    # ------------------------------------------------------------------ internals

    def _check_running(self) -> None:
        if self._state != _RUN:
            raise ValueError("Pool not running")

    def _reserve(self, n: int, *, accepted: bool = False) -> None:
        """Count ``n`` chunks as in flight, so the pool cannot finish under them.
        ``accepted``: an imap submission, allowed after ``close()``."""
        with self._lock:
            if self._state == _TERMINATE or (self._state == _CLOSE and not accepted):
                raise ValueError("Pool not running")
            self._in_flight += n

    def _release(self, n: int) -> None:
        with self._lock:
            self._in_flight -= n
            stop = self._stop_due()
        if stop:
            self._handler.stop()

    def _stop_due(self) -> bool:
        """Whether to stop the results thread now (call with ``_lock`` held; true once)."""
        if self._state == _RUN or self._in_flight or self._feeding or self._stop_sent:
            return False
        self._stop_sent = True
        return True

    def _send_counted(self, method: str, args: tuple[Any, ...],
                      on_done: Callable[[Future[Any]], None] | None) -> Future[Any]:
        """Submit one reserved chunk to the least busy actor; ``on_done`` runs when it
        resolves, before the chunk stops counting as in flight."""
        with self._submit_lock:
            with self._lock:
                n = len(self._actors)
                index = min(range(n), key=lambda k: (self._load[k], (k - self._next_actor) % n))
                self._next_actor = index + 1
                self._load[index] += 1
            try:
                fut = getattr(self._actors[index], method).remote(*args).future()
            except BaseException:
                with self._lock:
                    self._load[index] -= 1
                self._release(1)
                raise
        fut.add_done_callback(partial(self._chunk_done, index, on_done))
        return fut

    def _chunk_done(self, index: int, on_done: Callable[[Future[Any]], None] | None, fut: Future[Any]) -> None:
        try:
            if on_done is not None:
                on_done(fut)
        except Exception:
            logger.exception("Pool could not record a chunk's result")
        finally:
            with self._lock:
                self._load[index] -= 1
                self._in_flight -= 1
                stop = self._stop_due()
            if stop:
                self._handler.stop()


def _check_callables(func: Any, callback: Any, error_callback: Any) -> None:
    if not callable(func):
        raise TypeError(f"func must be callable, not {type(func).__name__}")
    for name, cb in (("callback", callback), ("error_callback", error_callback)):
        if cb is not None and not callable(cb):
            raise TypeError(f"{name} must be callable or None, not {type(cb).__name__}")


def _check_chunksize(chunksize: Any, *, allow_none: bool) -> None:
    if chunksize is None and allow_none:
        return
    if isinstance(chunksize, bool) or not isinstance(chunksize, int):
        raise TypeError(f"chunksize must be an int{' or None' if allow_none else ''}, "
                        f"not {type(chunksize).__name__}")
    if chunksize < 1:
        raise ValueError(f"chunksize must be 1 or more, got {chunksize}")


__all__ = ["Pool", "AsyncResult", "IMapIterator", "IMapUnorderedIterator", "TimeoutError"]
