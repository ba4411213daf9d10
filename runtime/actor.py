"""``@lumos.remote`` on a class: actors, their handles and methods.

    @lumos.remote
    class Counter:
        def __init__(self):
            self.n = 0
        def incr(self, by=1):
            self.n += by
            return self.n

    c = Counter.remote()                 # an ActorHandle; the GCS creates the actor
    lumos.get(c.incr.remote())           # 1
    lumos.get([c.incr.remote() for _ in range(3)])   # [2, 3, 4]: one caller's calls run in order

A handle can be passed to tasks and other actors. The actor lives until it is killed
(``lumos.kill``), exits (``exit_actor()``), its job ends (unless detached), or every
handle in the process that created it is gone and no copy was sent elsewhere.
"""

from __future__ import annotations

import functools
import inspect
import itertools
import pickle
import types
from typing import Any, Callable

from lumos import exceptions as exc
from lumos import options as opts_mod
from lumos._private import arity, interrupts
from lumos._private import serialization as ser
from lumos._private import worker_context
from lumos._private.core_worker.core_worker import function_id_of
from lumos._private.core_worker.tasks import TaskTemplate
from lumos._private.ids import ActorID, random_id
from lumos._private.protocol.vocab import TaskKind
from lumos._private.task_spec import task_template
from lumos.object_ref import ObjectRef

_METHOD_OPTIONS = {"num_returns", "max_task_retries", "retry_exceptions", "concurrency_group", "name",
                   "enable_task_events", "tensor_transport"}
#: Methods every actor has: end it after the calls before (terminate), or answer once it
#: is up (ready: ``lumos.get(actor.__ray_ready__.remote())``).
_BUILTIN_METHODS = ("__lumos_terminate__", "__ray_terminate__", "__lumos_ready__", "__ray_ready__")


class ActorClassInheritanceException(TypeError):
    """A class tried to inherit from an actor class (as in Ray, not allowed)."""


def method(*args: Any, **options: Any) -> Callable[[Any], Any]:
    """Options for one actor method: ``@lumos.method(num_returns=2)``; bare
    ``@lumos.method`` (no options) is accepted, as in Ray."""
    if len(args) == 1 and not options and callable(args[0]):
        args[0].__lumos_method_options__ = {}
        return args[0]  # type: ignore[no-any-return]
    if args:
        raise TypeError("use @lumos.method(num_returns=N) with keyword options")
    unknown = set(options) - _METHOD_OPTIONS
    if unknown:
        raise ValueError(f"invalid option(s) {sorted(unknown)} for @lumos.method; valid: {sorted(_METHOD_OPTIONS)}")
    if "num_returns" in options:
        _check_method_num_returns(options["num_returns"])
    if "enable_task_events" in options:
        opts_mod.OPTIONS["enable_task_events"].check("enable_task_events", options["enable_task_events"])
    _check_tensor_transport(options)
    _check_group(options)

    def decorate(fn: Any) -> Any:
        fn.__lumos_method_options__ = dict(options)
        return fn
    return decorate


def _check_method_num_returns(value: Any) -> None:
    if value == "dynamic":
        raise ValueError("num_returns='dynamic' is supported for remote functions only in lumos; an actor "
                         "method that yields streams its values with num_returns='streaming' (the default "
                         "for generator methods)")
    opts_mod.OPTIONS["num_returns"].check("num_returns", value)


def _check_tensor_transport(options: dict[str, Any]) -> None:
    if options.get("tensor_transport") not in (None, "object_store", "OBJECT_STORE"):
        from lumos._private.compat import not_implemented_error
        raise not_implemented_error(f"the method option tensor_transport={options['tensor_transport']!r}",
                                    "lumos has no GPU tensor transport; values go through the object store")


def _check_group(options: dict[str, Any]) -> None:
    group = options.get("concurrency_group")
    if group is not None and (not isinstance(group, str) or not group):
        raise TypeError("concurrency_group must be a group name (a non-empty str)")


def exit_actor() -> None:
    """End the current actor on purpose: no restart; its handles then raise ``ActorDiedError``."""
    cw = worker_context.core_worker
    if cw is None or not worker_context.is_worker or cw.current_actor_id is None:
        raise TypeError("exit_actor() can only be called inside an actor")
    raise exc.ActorExitRequest("the actor exited via exit_actor()")


#: Special methods an actor's handle never calls remotely: the object protocol Python,
#: pickle and copy look up on an instance (a handle answers them itself).
_LOCAL_DUNDERS = frozenset((
    "__init__", "__new__", "__del__", "__init_subclass__", "__class_getitem__", "__subclasshook__",
    "__getattr__", "__getattribute__", "__setattr__", "__delattr__", "__dir__", "__repr__", "__str__",
    "__format__", "__hash__", "__eq__", "__ne__", "__sizeof__", "__reduce__", "__reduce_ex__",
    "__getstate__", "__setstate__", "__getnewargs__", "__getnewargs_ex__", "__copy__", "__deepcopy__",
    "__post_init__"))


def _method_table(cls: type) -> dict[str, dict[str, Any]]:
    """The methods a handle calls: every function of the class, its own special methods
    too (``handle.__len__.remote()``, as in Ray), but not the object protocol."""
    table: dict[str, dict[str, Any]] = {}
    for name, fn in inspect.getmembers(cls, predicate=lambda f: inspect.isfunction(f) or inspect.ismethod(f)):
        if name in _LOCAL_DUNDERS or name.startswith("__lumos") or name.startswith("__ray"):
            continue
        opts = dict(getattr(fn, "__lumos_method_options__", {}))
        if "num_returns" not in opts and (inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)):
            opts["num_returns"] = "streaming"
        table[name] = opts
    return table


def _arity_table(cls: type, names: Any) -> dict[str, arity.Spec]:
    """The signature (``arity.Spec``) of each of ``cls``'s methods in ``names`` Python can
    read (``self`` left out, as it is for a static method's callers)."""
    out: dict[str, arity.Spec] = {}
    for name in names:
        raw = inspect.getattr_static(cls, name, None)
        fn = getattr(cls, name, None)
        if fn is None:
            continue
        spec = arity.spec_of(fn, drop_first=not isinstance(raw, (staticmethod, classmethod)))
        if spec is not None:
            out[name] = spec
    return out


class ActorClass:
    """A class made remote. ``.remote(...)`` creates an actor and returns its handle."""

    def __init__(self, cls: type, options: dict[str, Any]) -> None:
        self._cls = cls
        self._options = opts_mod.validate(dict(options), opts_mod.ACTOR)
        self._pickled: bytes | None = None
        self._methods  # noqa: B018  (read the class now: its mistakes show at the decorator)
        self.__name__ = cls.__name__
        self.__qualname__ = cls.__qualname__
        self.__module__ = cls.__module__
        self.__doc__ = cls.__doc__

    # An actor class unpickled in a worker may hold a class cloudpickle is still filling in
    # (a class defined in __main__ whose methods name it: ``Node.remote()`` inside ``Node``),
    # so what is read from the class is read at first use, not when it is rebuilt.

    @functools.cached_property
    def _methods(self) -> dict[str, dict[str, Any]]:
        return _method_table(self._cls)

    @functools.cached_property
    def _arity(self) -> dict[str, arity.Spec]:
        """Method name -> its signature: calls are checked where they are made."""
        return _arity_table(self._cls, self._methods)

    @functools.cached_property
    def _check_init(self) -> Any:
        return arity.checker(self._cls.__name__, arity.spec_of(self._cls))

    def __getattr__(self, name: str) -> Any:
        """The class's own attributes read through the actor class, as in Ray (whose actor
        class derives from the user's): constants, static and class methods, and the
        plain functions of its methods (``Cls.method`` is not remote)."""
        cls = self.__dict__.get("_cls")
        if cls is None or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        try:
            return getattr(cls, name)
        except AttributeError:
            raise AttributeError(f"actor class {cls.__name__} has no attribute {name!r}") from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor class {self._cls.__name__} cannot be instantiated directly; "
                        f"use {self._cls.__name__}.remote(...) to create an actor")

    def __repr__(self) -> str:
        return f"<lumos.remote actor class {self._cls.__qualname__!r}>"

    def __reduce__(self) -> Any:
        return (_rebuild_actor_class, (self._cls, self._options, self.__qualname__, self.__module__, self.__doc__))

    def remote(self, *args: Any, **kwargs: Any) -> "ActorHandle":
        """Create an actor; its ``__init__`` runs on the cluster with these arguments."""
        return self._remote(args, kwargs, self._options)

    def options(self, **options: Any) -> "_ActorClassOptions":
        """A copy with some options changed, e.g. ``Cls.options(name="a", num_gpus=1)``."""
        return _ActorClassOptions(self, opts_mod.merged(self._options, options, opts_mod.ACTOR))

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Record the actor's creation for a DAG (``lumos.dag``): ``node.method.bind(...)``
        records calls on it, ``execute()`` makes them."""
        from lumos.dag import ClassNode
        return ClassNode(self, args, kwargs)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        raise ActorClassInheritanceException(
            f"class {self._cls.__name__} is an actor class (made by @lumos.remote) and cannot be inherited "
            f"from; inherit from the plain class and decorate the subclass with @lumos.remote")

    def _remote(self, args: tuple[Any, ...], kwargs: dict[str, Any], options: dict[str, Any]) -> "ActorHandle":
        self._check_init(args, kwargs)  # (``__init__``'s arguments, as in Ray)
        cw = worker_context.require_or_init()
        o = opts_mod.resolved(options, opts_mod.ACTOR)
        cls = self._cls
        if self._pickled is None:
            try:
                self._pickled = ser.dumps_code(cls)
            except Exception as e:
                raise TypeError(f"actor class {cls.__qualname__} cannot be pickled: {e}") from None
        name = o["name"]
        if o["get_if_exists"] and not name:
            raise ValueError("get_if_exists=True needs a name=...")
        if name is not None and not name:
            raise ValueError("an actor name must be a non-empty string")
        namespace = o["namespace"] if o["namespace"] is not None else _current_namespace(cw)
        detached = o["lifetime"] == "detached"
        max_task_retries = o["max_task_retries"] or 0
        qualname = f"{cls.__module__}.{cls.__qualname__}"
        resources = opts_mod.resource_request(o, opts_mod.ACTOR)
        opts_mod.check_group_request(o, resources, f"actor {cls.__name__}")  # (ValueError here, as in Ray)
        template = task_template(
            kind=TaskKind.ACTOR_CREATION_TASK, function_id=function_id_of(self._pickled), function_name=qualname,
            name=f"{cls.__name__}.__init__", resources=resources,
            strategy=opts_mod.strategy_of(o), pickled_function=self._pickled,
            runtime_env=opts_mod.env_vars_of(o["runtime_env"]), enable_task_events=o["enable_task_events"] is not False)
        methods = self._methods
        if o["enable_task_events"] is False:  # as in Ray: the actor's default for its methods' calls
            methods = {name: {"enable_task_events": False, **opts}
                       for name, opts in {**dict.fromkeys(_BUILTIN_METHODS, {}), **methods}.items()}
        max_pending = o["max_pending_calls"] if o["max_pending_calls"] is not None else -1
        meta = {"methods": methods, "max_task_retries": max_task_retries, "class_name": cls.__name__,
                "max_pending_calls": max_pending, "arity": self._arity}
        actor_options = {
            "name": name or "", "namespace": namespace, "detached": detached,
            "max_restarts": o["max_restarts"] or 0, "get_if_exists": bool(o["get_if_exists"]),
            "max_concurrency": o["max_concurrency"], "checkpoint_interval": o["checkpoint_interval"],
            "concurrency_groups": o["concurrency_groups"],
            "class_name": cls.__name__, "handle_meta": pickle.dumps(meta),
        }
        placement_cpus = opts_mod.placement_cpus(o)
        if placement_cpus:
            actor_options["placement_cpus"] = placement_cpus
        actor_id = random_id(16)
        # The stop button: once the actor is asked for, its handle is made (dropped with the
        # KeyboardInterrupt, it ends the actor); without one, the actor lived until the job
        # ended. (Its arguments' pickling and a named actor's wait for the GCS stay
        # interruptible: ``create_actor`` opens ``interrupts.Window``s for them.)
        held = interrupts.hold()
        try:
            # An actor without a name: nothing at the GCS can refuse it, so its registration
            # goes on in the background (its calls queue behind it, a failure fails them).
            info = cw.create_actor(template, args, kwargs, actor_id, actor_options, wait=bool(name))
            if info is not None and info.actor_id != actor_id:
                return _handle_from_info(info)
            # A named actor ends with its creator's handle too, as in Ray (handles that get_actor
            # returns do not keep it alive); a detached one outlives the job.
            owned = not detached
            return ActorHandle(actor_id, cls.__name__, methods, max_task_retries, owned, max_pending, self._arity)
        finally:
            if held:
                interrupts.release()


def _rebuild_actor_class(cls: type, options: dict[str, Any], qualname: str, module: str,
                         doc: str | None) -> ActorClass:
    """Unpickle an actor class without reading ``cls`` yet (see ``ActorClass._methods``)."""
    self = ActorClass.__new__(ActorClass)
    self._cls = cls
    self._options = options
    self._pickled = None
    self.__name__ = cls.__name__
    self.__qualname__ = qualname
    self.__module__ = module
    self.__doc__ = doc
    return self


class _ActorClassOptions:
    def __init__(self, actor_class: ActorClass, options: dict[str, Any]) -> None:
        self._actor_class = actor_class
        self._options = options

    def remote(self, *args: Any, **kwargs: Any) -> "ActorHandle":
        return self._actor_class._remote(args, kwargs, self._options)

    def options(self, **options: Any) -> "_ActorClassOptions":
        return _ActorClassOptions(self._actor_class, opts_mod.merged(self._options, options, opts_mod.ACTOR))

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        from lumos.dag import ClassNode
        return ClassNode(self, args, kwargs)


def _current_namespace(cw: Any) -> str:
    return cw.namespace or f"anonymous-{cw.job_id.hex()}"


class ActorHandle:
    """A reference to an actor: ``handle.method.remote(...)`` calls it.

    Handles pickle: pass them to tasks and other actors.
    """

    #: ``ObjectRef[int]`` and the like in annotations, as in Ray.
    __class_getitem__ = classmethod(types.GenericAlias)

    def __init__(self, actor_id: ActorID, class_name: str, methods: dict[str, dict[str, Any]],
                 max_task_retries: int, owned: bool = False, max_pending_calls: int = -1,
                 arity_specs: dict[str, arity.Spec] | None = None) -> None:
        self._actor_id = actor_id
        self._class_name = class_name
        self._methods = methods
        self._max_task_retries = max_task_retries
        self._seq = itertools.count()
        #: This is the creating process's handle; the actor ends when it is collected
        #: (unless a copy was sent elsewhere).
        self._owned = owned
        self._escaped = False
        self._templates: dict[Any, TaskTemplate] = {}
        self._max_pending_calls = max_pending_calls
        #: Method name -> its signature (from the class), and the checkers made from them.
        self._arity = arity_specs or {}
        self._checkers: dict[str, Callable[[tuple[Any, ...], dict[str, Any]], None]] = {}

    def __getattr__(self, name: str) -> "ActorMethod":
        if name.startswith("_") and name not in self._methods and name not in _BUILTIN_METHODS:
            raise AttributeError(name)
        if name not in self._methods and name not in _BUILTIN_METHODS:
            raise AttributeError(f"actor {self._class_name} has no method {name!r}")
        # Not cached on the handle: a cycle would keep the handle (and its actor) alive.
        return ActorMethod(self, name, self._methods.get(name, {}))

    def __dir__(self) -> list[str]:
        # The actor's methods, as Ray's handle lists them: ``handle.<Tab>`` in a notebook
        # completes them.
        return sorted({*object.__dir__(self), *(n for n in self._methods if not n.startswith("_"))})

    def __repr__(self) -> str:
        return f"ActorHandle({self._class_name}, {self._actor_id.hex()[:16]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ActorHandle) and other._actor_id == self._actor_id

    def __hash__(self) -> int:
        return hash(self._actor_id)

    def __reduce__(self) -> Any:
        self._escaped = True
        cw = worker_context.core_worker
        if cw is not None and cw._registering:
            cw.wait_registered(self._actor_id)  # the receiver asks the GCS about the actor
        return (_rebuild_handle, (self._actor_id, self._class_name, self._methods, self._max_task_retries,
                                  self._max_pending_calls, self._arity))

    @interrupts.finalizer  # (a stop pressed while it runs: sent again after it)
    def __del__(self) -> None:
        if not self._owned or self._escaped:
            return
        cw = worker_context.core_worker
        if cw is None or cw._closed:
            return
        try:
            cw._post(cw.actor_submitter.release_handle, self._actor_id)
        except exc.LumosSystemError:
            return  # shut down meanwhile: the actor goes with the job

    @property
    def _actor_id_hex(self) -> str:
        return self._actor_id.hex()

    def _submit(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                options: dict[str, Any]) -> Any:
        check = self._checkers.get(name)
        if check is None:
            check = self._checkers[name] = arity.checker(f"{self._class_name}.{name}", self._arity.get(name))
        check(args, kwargs)  # (a wrong call raises TypeError here, as in Ray, not from get())
        cw = worker_context.require()
        limit = self._max_pending_calls
        if limit > 0 and not cw.actor_submitter.reserve_call(self._actor_id, limit):
            raise exc.PendingCallsLimitExceeded(
                f"actor {self._class_name} has {limit} calls pending (max_pending_calls={limit})")
        try:
            template = self._templates_get(name, options)
            refs = cw.submit_task(template, args, kwargs, (self._actor_id, next(self._seq), cw.worker_id,
                                                           options.get("concurrency_group")))
        except BaseException as e:
            # Not made (an argument that cannot be pickled, a bad option, the stop button
            # as the arguments were pickled): its place is free again. Kept, two such
            # calls locked a max_pending_calls=2 actor out. (A stop pressed as the call
            # was handed over raises once it is made: that one keeps its place.)
            if limit > 0 and not getattr(e, "lumos_submitted", False):
                cw.actor_submitter.unreserve_call(self._actor_id)
            raise
        n = template.num_returns
        if n == 1 or n == -1:  # -1: an ObjectRefGenerator
            return refs[0]
        if n == 0:
            return None
        return refs

    def _templates_get(self, name: str, options: dict[str, Any]) -> TaskTemplate:
        key = (name, repr(sorted(options.items()))) if options else name
        cache = self._templates
        t = cache.get(key)
        if t is None:
            n = options.get("num_returns", 1)
            n = -1 if n == "streaming" else n
            retries = options.get("max_task_retries", self._max_task_retries)
            t = task_template(kind=TaskKind.ACTOR_TASK, function_id=b"", function_name=name,
                              name=options.get("name") or f"{self._class_name}.{name}", num_returns=n,
                              max_retries=retries, retry_exceptions=options.get("retry_exceptions", False),
                              enable_task_events=options.get("enable_task_events", True))
            cache[key] = t
        return t


def _rebuild_handle(actor_id: ActorID, class_name: str, methods: dict[str, dict[str, Any]],
                    max_task_retries: int, max_pending_calls: int = -1,
                    arity_specs: dict[str, arity.Spec] | None = None) -> ActorHandle:
    return ActorHandle(actor_id, class_name, methods, max_task_retries, False, max_pending_calls, arity_specs)


def _handle_from_info(info: Any) -> ActorHandle:
    meta = pickle.loads(info.handle_meta) if info.handle_meta else {}
    return ActorHandle(info.actor_id, meta.get("class_name", info.class_name), meta.get("methods", {}),
                       meta.get("max_task_retries", 0), False, meta.get("max_pending_calls", -1),
                       meta.get("arity"))


class ActorMethod:
    """``handle.method``: ``.remote(...)`` submits a call; ``.options(num_returns=...)``."""

    __slots__ = ("_handle", "_name", "_options")

    def __init__(self, handle: ActorHandle, name: str, options: dict[str, Any]) -> None:
        self._handle = handle
        self._name = name
        self._options = options

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._handle._submit(self._name, args, kwargs, self._options)

    def options(self, **options: Any) -> "ActorMethod":
        unknown = set(options) - _METHOD_OPTIONS
        if unknown:
            raise ValueError(f"invalid option(s) {sorted(unknown)} for an actor method")
        if "num_returns" in options:
            _check_method_num_returns(options["num_returns"])
        if "enable_task_events" in options:
            opts_mod.OPTIONS["enable_task_events"].check("enable_task_events", options["enable_task_events"])
        _check_tensor_transport(options)
        _check_group(options)
        merged = dict(self._options)
        merged.update(options)
        return ActorMethod(self._handle, self._name, merged)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(f"actor methods cannot be called directly; use "
                        f"handle.{self._name}.remote(...) instead of handle.{self._name}(...)")

    def __repr__(self) -> str:
        return f"<actor method {self._handle._class_name}.{self._name}>"

    def bind(self, *args: Any, **kwargs: Any) -> Any:
        """Record a call on this actor for a DAG (``lumos.dag``)."""
        from lumos.dag import ClassMethodNode
        return ClassMethodNode(self._handle, self._name, self._options, args, kwargs).outputs()


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The handle of the named actor ``name`` (in ``namespace``, default: this job's).

    Raises:
        ValueError: no live actor has that name there.
    """
    from lumos._private.protocol import messages as m
    if not isinstance(name, str):
        raise TypeError(f"get_actor() needs the actor's name as a string, not {type(name).__name__}")
    if not name:
        raise ValueError("get_actor() needs the actor's name, not an empty string")  # (as in Ray)
    cw = worker_context.require()
    ns = namespace if namespace is not None else _current_namespace(cw)
    info = cw.call_gcs(m.GetNamedActor(name, ns))
    if info is None or info.state == "DEAD":
        raise ValueError(f"no actor named {name!r} in namespace {ns!r}")
    cw._post(cw.actor_submitter.track, info.actor_id, info)
    return _handle_from_info(info)


def kill(actor: ActorHandle, *, no_restart: bool = True) -> None:
    """Kill an actor now. Calls in flight and later calls raise ``ActorDiedError``.

    With ``no_restart=False`` the actor is restarted if its ``max_restarts`` allows.
    """
    from lumos._private.protocol import messages as m
    if not isinstance(actor, ActorHandle):
        raise exc.WrongArgumentError(f"lumos.kill() takes an actor handle, not {type(actor).__name__}"
                                     + ("; use lumos.cancel() for tasks" if isinstance(actor, ObjectRef) else ""))
    cw = worker_context.require()
    cw.wait_registered(actor._actor_id)  # the GCS must know the actor before it can end it
    cw.call_gcs(m.KillActor(actor._actor_id, bool(no_restart), "killed by lumos.kill()"))


__all__ = ["ActorClass", "ActorHandle", "ActorMethod", "ActorClassInheritanceException", "method", "exit_actor",
           "get_actor", "kill", "list_named_actors"]


def list_named_actors(all_namespaces: bool = False) -> list[Any]:
    """Names of live named actors in this job's namespace, or ``{"name", "namespace"}``
    dicts for every namespace with ``all_namespaces=True`` (Ray's ``ray.util.list_named_actors``)."""
    from lumos._private.protocol import messages as m
    cw = worker_context.require_or_init()
    infos = cw.call_gcs(m.ListActors(None))
    live = [a for a in infos if a.name and a.state != "DEAD"]
    if all_namespaces:
        return [{"name": a.name, "namespace": a.namespace} for a in live]
    ns = _current_namespace(cw)
    return [a.name for a in live if a.namespace == ns]
