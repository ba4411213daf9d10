"""``@lumos.remote`` on a function: a ``RemoteFunction`` whose ``.remote()`` submits tasks."""

from __future__ import annotations

import functools
from typing import Any, Callable

from lumos import options as opts_mod
from lumos._private import arity
from lumos._private import serialization as ser
from lumos._private import worker_context
from lumos._private.core_worker.core_worker import function_id_of
from lumos._private.core_worker.tasks import TaskTemplate
from lumos._private.protocol.vocab import TaskKind
from lumos._private.task_spec import task_template
from lumos.object_ref import ObjectRef


class RemoteFunction:
    """A function that runs as a task on the cluster.

    Example:
        >>> @lumos.remote
        ... def square(x):
        ...     return x * x
        >>> lumos.get(square.remote(3))
        9
    """

    def __init__(self, function: Callable[..., Any], options: dict[str, Any]) -> None:
        if not callable(function):
            raise TypeError(f"@lumos.remote needs a function or class, got {type(function).__name__}")
        self._function = function
        self._options = opts_mod.validate(dict(options), opts_mod.TASK)
        self._pickled: bytes | None = None
        self._pickled_dynamic: bytes | None = None
        self._templates: dict[Any, TaskTemplate] = {}
        #: The options dict of the last call and its template: calls through one function
        #: (or one ``.options()`` result) pass the same dict, never changed after it is made,
        #: and skip building the cache key (about 1-2 us a call).
        self._last_template: tuple[dict[str, Any], TaskTemplate] | None = None
        #: Checks a call's arguments against the function's signature (made on first call).
        self._check_args: Callable[[tuple[Any, ...], dict[str, Any]], None] | None = None
        functools.update_wrapper(self, function, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = getattr(self._function, "__name__", "f")
        raise TypeError(f"remote function {name}() cannot be called directly; "
                        f"use {name}.remote(...) to run it as a task, and lumos.get() for its result")

    def __repr__(self) -> str:
        return f"<lumos.remote function {getattr(self._function, '__qualname__', self._function)!r}>"

    def __reduce__(self) -> Any:
        return (RemoteFunction, (self._function, self._options))

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        """Submit a call; returns an ``ObjectRef`` (a list of them when ``num_returns > 1``)."""
        return self._remote(args, kwargs, self._options)

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Record a call for a DAG (``lumos.dag``); ``node.execute()`` makes it."""
        from lumos.dag import FunctionNode
        return FunctionNode(self, args, kwargs)

    def options(self, **options: Any) -> "_BoundOptions":
        """A copy of this function with some options changed, e.g. ``f.options(num_cpus=2)``."""
        return _BoundOptions(self, opts_mod.merged(self._options, options, opts_mod.TASK))

    def _template(self, options: dict[str, Any]) -> TaskTemplate:
        last = self._last_template
        if last is not None and last[0] is options:
            return last[1]
        key = tuple(sorted((k, repr(v)) for k, v in options.items()))
        template = self._templates.get(key)
        if template is not None:
            self._last_template = (options, template)
            return template
        o = opts_mod.resolved(options, opts_mod.TASK)
        if o["num_returns"] == "dynamic":
            if self._pickled_dynamic is None:
                from lumos.generator import _DynamicReturns
                self._pickled_dynamic = ser.dumps_code(_DynamicReturns(self._function))
            pickled = self._pickled_dynamic
        else:
            if self._pickled is None:
                self._pickled = ser.dumps_code(self._function)
            pickled = self._pickled
        fn = self._function
        fname = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', getattr(fn, '__name__', '?'))}"
        max_calls = o["max_calls"]
        resources = opts_mod.resource_request(o, opts_mod.TASK)
        opts_mod.check_group_request(o, resources, getattr(fn, "__name__", "the task"))
        if max_calls is None:  # as in Ray: a GPU task's worker exits after it, freeing the GPU's memory
            max_calls = 1 if resources.get("GPU") else 0
        template = task_template(
            kind=TaskKind.NORMAL_TASK, function_id=function_id_of(pickled), function_name=fname,
            name=o["name"] or getattr(fn, "__name__", "task"),
            num_returns=opts_mod.num_returns_of(o["num_returns"], fn, "num_returns" in options),
            resources=resources, max_retries=o["max_retries"], retry_exceptions=o["retry_exceptions"],
            strategy=opts_mod.strategy_of(o), pickled_function=pickled,
            runtime_env=opts_mod.env_vars_of(o["runtime_env"]), max_calls=max_calls,
            enable_task_events=o["enable_task_events"] is not False)
        self._templates[key] = template
        self._last_template = (options, template)
        return template

    def _remote(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
        check = self._check_args
        if check is None:
            fn = self._function
            check = self._check_args = arity.checker(getattr(fn, "__name__", "f"), arity.spec_of(fn))
        check(args, kwargs)  # (a wrong call raises TypeError here, as in Ray, not from get())
        cw = worker_context.require_or_init()
        template = self._template(options)
        refs = cw.submit_task(template, args, kwargs)
        n = template.num_returns
        if n == 1 or n == -1:  # -1: an ObjectRefGenerator
            return refs[0]
        if n == 0:
            return None
        return refs


class _BoundOptions:
    def __init__(self, fn: RemoteFunction, options: dict[str, Any]) -> None:
        self._fn = fn
        self._options = options

    def remote(self, *args: Any, **kwargs: Any) -> ObjectRef | list[ObjectRef] | None:
        return self._fn._remote(args, kwargs, self._options)  # type: ignore[no-any-return]

    def options(self, **options: Any) -> "_BoundOptions":
        return _BoundOptions(self._fn, opts_mod.merged(self._options, options, opts_mod.TASK))

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        from lumos.dag import FunctionNode
        return FunctionNode(self, args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)
