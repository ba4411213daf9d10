"""The public API: init, shutdown, get, put, wait, cancel, and cluster queries.

Each function validates its arguments, hands the work to the process's core worker and
returns; no sockets or event loops here.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import logging
import numbers
import os
import socket
import sys
import time
from typing import Any, Callable, Sequence

from lumos import exceptions as exc
from lumos import job_config as job_config_mod
from lumos._private import interrupts, worker_context, working_dir
from lumos._private.config import Config
from lumos._private.core_worker.core_worker import DRIVER, CoreWorker
from lumos._private.ids import NodeID, random_id, return_object_id
from lumos._private.node import (NodeProcesses, check_node_labels, default_store_bytes, find_local_token,
                                 new_session_dir, node_resources, read_current_cluster)
from lumos._private.process import read_private_file
from lumos._private.protocol import auth
from lumos._private.protocol import messages as m
from lumos._private.transport.connection import parse_address
from lumos.logging_config import logging_config_of
from lumos.object_ref import ObjectRef
from lumos.options import env_vars_of
from lumos.progress import kernel_shell
from lumos.util import tracebacks

logger = logging.getLogger(__name__)


class LumosContext:
    """What ``init()`` returns: addresses, the dashboard link, and ``with`` support.

    ``with lumos.init(): ...`` shuts the cluster down at the end of the block.
    """

    def __init__(self, address_info: dict[str, Any], dashboard_url: str) -> None:
        self.address_info = address_info
        #: Ray's attribute name: the dashboard login link (empty without a dashboard).
        self.dashboard_url = dashboard_url
        #: As Ray's context has them: this Python's version, and lumos's (``ray_version``,
        #: for code written for Ray; there is no commit to show).
        self.python_version = ".".join(map(str, sys.version_info[:3]))
        from lumos import __version__
        self.lumos_version = self.ray_version = __version__
        self.ray_commit = ""

    def __enter__(self) -> "LumosContext":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        shutdown()

    def __getitem__(self, key: str) -> Any:
        return self.address_info[key]

    def __repr__(self) -> str:
        return (f"LumosContext(gcs_address={self.address_info.get('gcs_address')!r}, "
                f"node_id={self.address_info.get('node_id')!r}, dashboard_url={self.dashboard_url!r})")

    def _repr_html_(self) -> str:
        """The cluster card (``%lumos status``); only a notebook front end asks for it."""
        if not is_initialized():
            return "<div><b>lumos</b> cluster (disconnected)</div>"
        from lumos.kernelext.display import ClusterStatus
        card = ClusterStatus.current(self.dashboard_url, str(self.address_info.get("gcs_address") or ""))
        return str(card._repr_html_())


def init(address: str | None = None, *, num_cpus: float | None = None, num_gpus: float | None = None,
         resources: dict[str, float] | None = None, memory: int | None = None,
         object_store_memory: int | None = None, namespace: str | None = None,
         ignore_reinit_error: bool = False, include_dashboard: bool | None = None,
         dashboard_host: str = "127.0.0.1", dashboard_port: int | None = None,
         log_to_driver: bool = True, runtime_env: dict[str, Any] | None = None,
         job_config: Any = None, labels: dict[str, str] | None = None, logging_config: Any = None,
         _system_config: dict[str, Any] | None = None, _token: str | None = None,
         _node_ip_address: str = "127.0.0.1", **kwargs: Any) -> LumosContext:
    """Start a private local cluster, or connect to a running one.

    Args:
        address: None or "local" starts a private cluster for this process (it ends
            with ``shutdown()`` or at exit). "auto" joins the cluster started on this
            machine with ``lumos start --head``; "HOST:PORT" joins that GCS (the
            cluster token comes from ``_token`` or ``LUMOS_CLUSTER_TOKEN``).
            "lumos://HOST:PORT" connects in client mode from a machine with no lumos
            node (``_token``: the token or its file; or ``LUMOS_CLUSTER_TOKEN[_FILE]``).
        num_cpus, num_gpus, resources, memory, object_store_memory, labels: the
            private cluster's node (GPUs are detected when ``num_gpus`` is None; labels,
            str -> str, describe the node: ``label_selector`` selects by them, and
            ``get_runtime_context().get_node_labels()`` and ``lumos.nodes()`` show them).
        namespace: namespace for named actors.
        runtime_env: the job's ``env_vars`` (and ``working_dir``, ``py_modules``, ``excludes``).
        job_config: a ``JobConfig`` (lumos's or Ray's): its runtime_env,
            namespace and py_logging_config apply where ``runtime_env``/``namespace``/
            ``logging_config`` are not given.
        logging_config: a ``LoggingConfig``: the root logger of this driver (now) and of
            the job's workers (before their first task of the job).
        ignore_reinit_error: return quietly if already initialized.
        _system_config: overrides of ``Config`` fields.

    Returns:
        A ``LumosContext`` (``dashboard_url``, ``address_info``; a context manager).

    Raises:
        RuntimeError: already initialized (and not ``ignore_reinit_error``).
        ConnectionError: the cluster at ``address`` cannot be reached.

    Example:
        >>> import lumos as ray
        >>> ray.init(num_cpus=2)
    """
    global failed_connect
    with worker_context.lock:
        if worker_context.core_worker is not None:
            if worker_context.is_worker or ignore_reinit_error:
                return worker_context.context or LumosContext({}, "")
            raise RuntimeError("lumos.init() was already called; call lumos.shutdown() first, "
                               "or pass ignore_reinit_error=True")
        for name in sorted(set(kwargs) & set(_REFUSED_INIT_ARGS)):
            if kwargs[name] not in (None, False):  # Ray's defaults mean "not used"
                raise NotImplementedError(f"init({name}=...) is not implemented in lumos; "
                                          f"{_REFUSED_INIT_ARGS[name]}")
        unknown = set(kwargs) - _IGNORED_INIT_ARGS - set(_REFUSED_INIT_ARGS)
        if unknown:
            raise TypeError(f"init() got unexpected arguments {sorted(unknown)}")
        runtime_env, namespace = job_config_mod.applied(job_config, runtime_env, namespace)
        job_metadata = job_config_mod.metadata_of(job_config)
        _check_number("num_cpus", num_cpus)
        _check_number("num_gpus", num_gpus)
        _check_number("object_store_memory", object_store_memory)
        _check_number("memory", memory)
        if resources is not None and not isinstance(resources, dict):
            raise TypeError("resources must be a dict of name -> amount")
        check_node_labels(labels)
        job_env = env_vars_of(runtime_env, job=True)
        job_code = working_dir.job_code_of(runtime_env)
        logs = logging_config_of(logging_config if logging_config is not None
                                 else getattr(job_config, "py_logging_config", None))
        if logs is not None:
            job_code = dataclasses.replace(job_code or working_dir.JobCode(None, []), logging_config=logs.to_dict())
        overrides = dict(_system_config or {})
        if not log_to_driver:
            overrides["log_to_driver"] = False
        config = Config.resolve(overrides)
        if address is None:
            address = os.environ.get("LUMOS_ADDRESS") or None
        if address in (None, "local"):
            dashboard = _dashboard_wanted(include_dashboard)
            ctx = _start_private(config, num_cpus, num_gpus, resources, memory, object_store_memory,
                                 namespace or "", _node_ip_address,
                                 (dashboard_host, 8265 if dashboard_port is None else dashboard_port)
                                 if dashboard else None, job_env, job_code, job_metadata, labels)
        else:
            if any(v is not None for v in (num_cpus, num_gpus, resources, object_store_memory, labels)):
                raise ValueError("num_cpus, num_gpus, resources, object_store_memory and labels describe a "
                                 "new cluster; they cannot be given when connecting to an existing one")
            try:
                if isinstance(address, str) and address.startswith("ray://"):  # Ray Client's scheme
                    address = "lumos://" + address[len("ray://"):]
                if isinstance(address, str) and address.startswith("lumos://"):
                    if logs is not None:
                        raise NotImplementedError("init(logging_config=...) is not implemented in client mode "
                                                  "(lumos://); configure logging in the tasks themselves")
                    ctx = _connect_client(config, address, namespace or "", _token, runtime_env, job_metadata)
                else:
                    ctx = _connect(config, address, namespace or "", _token, job_env, job_code, job_metadata)
            except BaseException as e:
                failed_connect = f"lumos.init(address={address!r}) failed: {type(e).__name__}: {e}"
                raise
        failed_connect = None
        worker_context.context = ctx
        if logs is not None:
            logs._apply()  # the driver's own root logger, as the workers' will be
        return ctx


#: Why the last ``init(address=...)`` failed (None after a successful ``init``): the
#: notebook extension then refuses to start a private cluster in its place.
failed_connect: str | None = None


_IGNORED_INIT_ARGS = {"logging_level", "logging_format", "configure_logging", "local_mode",
                      "_temp_dir", "_plasma_directory", "_enable_object_reconstruction",
                      "log_to_driver", "_metrics_export_port", "storage"}

_NO_CGROUPS = "lumos does not isolate its processes in cgroups"
#: Ray's init() arguments with no lumos counterpart (accepted at their defaults): what to do instead.
_REFUSED_INIT_ARGS = {
    "cgroup_path": f"{_NO_CGROUPS}; give the node fewer num_cpus or less memory",
    "enable_resource_isolation": f"{_NO_CGROUPS}; give the node fewer num_cpus or less memory",
    "system_reserved_cpu": f"{_NO_CGROUPS}; start the node with fewer num_cpus",
    "system_reserved_memory": f"{_NO_CGROUPS}; start the node with a smaller memory=",
    "proxy_server_url": "Ray Client proxies are not part of lumos; connect to the head's client server with "
                        "lumos.init('lumos://HEAD:10001') (client mode)",
}


def _hint(value: Any) -> str:
    from lumos.generator import ObjectRefGenerator
    if isinstance(value, ObjectRefGenerator):
        return " (a streaming task: iterate it, `for ref in gen`, to get one ref per value)"
    return ""


def _check_number(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, not {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


def _dashboard_wanted(include_dashboard: bool | None) -> bool:
    """``include_dashboard=None`` (Ray's default) starts it unless ``LUMOS_INCLUDE_DASHBOARD=0``."""
    if include_dashboard is None:
        return os.environ.get("LUMOS_INCLUDE_DASHBOARD", "1").lower() not in ("0", "false", "no", "off")
    if not isinstance(include_dashboard, bool):
        raise TypeError(f"include_dashboard must be a bool or None, not {type(include_dashboard).__name__}")
    return include_dashboard


def _start_private(config: Config, num_cpus: float | None, num_gpus: float | None,
                   resources: dict[str, float] | None, memory: int | None, store_bytes: int | None,
                   namespace: str, node_ip: str, dashboard: tuple[str, int] | None = None,
                   job_env: dict[str, str] | None = None,
                   job_code: working_dir.JobCode | None = None,
                   job_metadata: dict[str, str] | None = None,
                   labels: dict[str, str] | None = None) -> LumosContext:
    session_dir = new_session_dir()
    node = NodeProcesses(session_dir, config)
    token = auth.new_token().hex().encode()
    node.write_token(token)
    res = node_resources(num_cpus, num_gpus, resources, memory)
    res[f"node:{node_ip}"] = 1.0
    res["node:__internal_head__"] = 1.0
    store = int(store_bytes) if store_bytes else (config.object_store_memory or default_store_bytes())
    worker_context.local_node = node
    dash = None
    try:
        if dashboard is not None:  # starts in parallel with the GCS; it connects on first use
            from lumos._private.dashboard_process import spawn_dashboard
            dash = spawn_dashboard(session_dir, f"unix:{node.gcs_unix}", node.token_path, *dashboard)
            node.procs.append(dash[0])  # node.stop() (shutdown) stops it with the others
        node.start_gcs_and_raylet(resources=res, store_bytes=store, host=node_ip, gcs_port=0, private=True,
                                  labels=labels)
        assert node.gcs_address is not None
        cw = _start_core_worker(config, token, node.gcs_unix, node.raylet_socket, session_dir,
                                node.node_id, node.store_dir, node_ip, namespace, job_env, job_code,
                                job_metadata)
    except BaseException:
        if dash is not None:
            os.close(dash[1])
        node.stop()
        worker_context.local_node = None
        raise
    worker_context.core_worker = cw
    _register_exit_handler()
    gcs = f"{node.gcs_address[0]}:{node.gcs_address[1]}"
    dashboard_url = ""
    if dash is not None:
        from lumos._private.dashboard_process import DashboardStartError, await_dashboard
        try:
            dashboard_url = await_dashboard(dash[0], dash[1], session_dir)
        except DashboardStartError as e:
            logger.warning("the cluster runs without its dashboard: %s", e)
    return LumosContext({"gcs_address": gcs, "address": gcs, "node_id": node.node_id.hex(),
                         "session_dir": session_dir, "node_ip_address": node_ip,
                         "raylet_socket_name": node.raylet_socket, "job_id": cw.job_id.hex()}, dashboard_url)


def _start_core_worker(config: Config, token: bytes, gcs_address: Any, raylet_socket: str, session_dir: str,
                       node_id: NodeID, store_dir: str, node_ip: str, namespace: str,
                       job_env: dict[str, str] | None = None,
                       job_code: working_dir.JobCode | None = None,
                       job_metadata: dict[str, str] | None = None) -> CoreWorker:
    main = sys.modules.get("__main__")
    entry = getattr(main, "__file__", None) or "interactive"
    cw = CoreWorker(mode=DRIVER, config=config, token=token, gcs_address=gcs_address,
                    raylet_socket=raylet_socket, session_dir=session_dir, node_id=node_id,
                    store_dir=store_dir, worker_id=random_id(16), node_ip=node_ip,
                    namespace=namespace or random_id(8).hex(), entrypoint=entry, job_env_vars=job_env,
                    job_code=job_code, job_metadata=job_metadata)
    cw.start()
    _watch_cells()
    return cw


def _watch_cells(on: bool = True) -> None:
    """In a kernel, lumos's SIGINT handler is in place from each cell's start while a
    driver is connected (``interrupts.watch_cells``); in IPython or at Python's prompt, a
    shown error lets go of what lumos's frames held (``lumos.util.tracebacks.watch``)."""
    shell = kernel_shell()
    if shell is not None:
        interrupts.watch_cells(shell, on)
    tracebacks.watch(on)


def _connect(config: Config, address: str, namespace: str, token_arg: str | None,
             job_env: dict[str, str] | None = None,
             job_code: working_dir.JobCode | None = None,
             job_metadata: dict[str, str] | None = None) -> LumosContext:
    token_text = token_arg or os.environ.get("LUMOS_CLUSTER_TOKEN")
    session_hint = None
    if address == "auto":
        # Only this user's private record counts (another user could plant one pointing
        # at their own GCS); an unsafe root raises with what to do.
        current = read_current_cluster()
        if current is None or "gcs_address" not in current:
            raise ConnectionError("no lumos cluster was started on this machine "
                                  "(run `lumos start --head` first, or call lumos.init() with no address)")
        address = current["gcs_address"]
        session_hint = current.get("session_dir")
    else:
        try:
            current = read_current_cluster()
        except OSError:
            current = None
        if current is not None and current.get("gcs_address") == address:
            session_hint = current.get("session_dir")
    if token_text is None and session_hint:
        try:
            token_text = read_private_file(os.path.join(session_hint, "token")).decode().strip()
        except (OSError, UnicodeDecodeError):
            pass
    looked = ""
    if token_text is None and "://" not in address:
        token_text, looked = find_local_token(address)  # a cluster this user started here
    if not token_text:
        raise ConnectionError(f"connecting to {address} needs the cluster token: pass _token=... or set "
                              "LUMOS_CLUSTER_TOKEN (see `lumos status` on the head node)"
                              + (f"; {looked}" if looked else ""))
    token = token_text.encode()
    gcs_address = parse_address(address)
    nodes = _fetch_nodes(config, token, gcs_address)
    here = {socket.gethostname()}
    local = [n for n in nodes if n.state == "ALIVE" and n.hostname in here and os.path.exists(n.address.unix_path)]
    local.sort(key=lambda n: not n.is_head)  # the head's raylet when several nodes share this machine
    if not local:
        raise ConnectionError(f"no lumos node of the cluster at {address} runs on this machine; "
                              f"run `lumos start --address {address}` here first")
    node = local[0]
    cw = _start_core_worker(config, token, gcs_address, node.address.unix_path, node.session_dir,
                            node.node_id, node.object_store_dir, node.address.host, namespace, job_env,
                            job_code, job_metadata)
    worker_context.core_worker = cw
    _register_exit_handler()
    return LumosContext({"gcs_address": address, "address": address, "node_id": node.node_id.hex(),
                         "session_dir": node.session_dir, "node_ip_address": node.address.host,
                         "job_id": cw.job_id.hex()}, node.dashboard_url or _head_dashboard_url(node))


def _head_dashboard_url(node: m.NodeInfo) -> str:
    """A driver on the head's machine: the link of the dashboard ``lumos start --head``
    started, which it wrote into the head's session directory ("" when there is none)."""
    if not node.is_head:
        return ""
    from lumos._private.dashboard_process import read_dashboard_url
    return read_dashboard_url(node.session_dir)


def _connect_client(config: Config, address: str, namespace: str, token_arg: str | None,
                    runtime_env: dict[str, Any] | None,
                    job_metadata: dict[str, str] | None = None) -> LumosContext:
    """Client mode: this process runs no node; its session on the head does the work."""
    from lumos._private.client import worker as client
    cw = client.connect(config, address, namespace, token_arg, runtime_env, job_metadata)
    worker_context.core_worker = cw  # type: ignore[assignment]
    _watch_cells()
    _register_exit_handler()
    w = cw.welcome
    return LumosContext({"gcs_address": w["gcs_address"], "address": address, "client_address": address,
                         "node_id": cw.node_id.hex(), "node_ip_address": cw.node_ip,
                         "session_dir": cw.session_dir, "job_id": cw.job_id.hex()}, w["dashboard_url"])


def _fetch_nodes(config: Config, token: bytes, gcs_address: Any) -> list[m.NodeInfo]:
    from lumos._private.transport.connection import ConnectionLost, WireVersionMismatch, connect
    where = f"{gcs_address[0]}:{gcs_address[1]}" if isinstance(gcs_address, tuple) else gcs_address

    async def ask() -> list[m.NodeInfo]:
        try:
            conn = await connect(gcs_address, token=token, config=config, name="init->gcs")
        except WireVersionMismatch as e:
            raise ConnectionError(f"cannot connect to the lumos GCS at {where}: {e}") from None
        except ConnectionLost:
            raise ConnectionError(f"the lumos GCS at {where} closed the connection during authentication: "
                                  "the cluster token is probably wrong (pass the token `lumos start --head` printed, "
                                  "as _token=... or LUMOS_CLUSTER_TOKEN)") from None
        try:
            return await conn.call(m.GetAllNodes(), config.rpc_timeout_s)  # type: ignore[no-any-return]
        finally:
            conn.close()

    try:
        return _run_on_own_loop(ask, config.connect_timeout_s + config.rpc_timeout_s + 5)
    except ConnectionError as e:
        if "authentication" in str(e):
            raise
        raise ConnectionError(f"cannot reach the lumos GCS at {where}: {e}") from None
    except (OSError, TimeoutError) as e:
        raise ConnectionError(f"cannot reach the lumos GCS at {where}: {e or type(e).__name__}") from None


def _run_on_own_loop(make_coro: Callable[[], Any], timeout_s: float) -> Any:
    """Run ``make_coro()`` on a new loop in a ``lumos-connect`` thread and wait for it.

    ``init()`` runs before the core worker (and its ``lumos-io`` loop) exists, and the
    caller's thread may be running a loop of its own (a notebook cell runs inside
    ipykernel's), where ``asyncio.run`` refuses to start.
    """
    import concurrent.futures
    import threading
    from lumos._private.transport import eventloop
    result: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def main() -> None:
        try:
            result.set_result(eventloop.run(make_coro()))
        except BaseException as e:  # handed to the caller
            result.set_exception(e)

    threading.Thread(target=main, name="lumos-connect", daemon=True).start()
    try:
        return result.result(timeout_s)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"no answer within {timeout_s:.0f}s") from None


_exit_registered = False


def _register_exit_handler() -> None:
    global _exit_registered
    if not _exit_registered:
        atexit.register(_at_exit)
        _exit_registered = True


def _at_exit() -> None:
    """At interpreter exit: let the calls the script submitted last run and their output
    arrive (``f.remote()`` as a script's last line runs; Ray ends the job at once and
    such a call may never start), within ``exit_drain_timeout_s``; then shut down. A script that ended with an uncaught
    exception (``sys.last_value``) does not wait: its calls' results have no reader."""
    cw = worker_context.core_worker
    failed = getattr(sys, "last_value", None) is not None
    if cw is not None and not worker_context.is_worker and cw.config.exit_drain_timeout_s > 0 and not failed:
        timeout_s = cw.config.exit_drain_timeout_s
        try:
            left = cw.drain_at_exit(timeout_s)
        except KeyboardInterrupt:
            left = 0  # Ctrl-C at exit: stop waiting
        if left:
            sys.stderr.write(f"lumos: {left} task(s) or actor call(s) this script submitted had not finished "
                             f"{timeout_s:g}s after it ended (exit_drain_timeout_s); they are abandoned\n")
    shutdown()


def shutdown(wait_for_processes: bool = True) -> None:
    """Disconnect; stop the private cluster if ``init()`` started one. Safe to call twice.

    Args:
        wait_for_processes: accepted for Ray's signature; lumos always waits (a few
            seconds at most) for the processes it stops, so none outlives this call.
    """
    with worker_context.lock:
        if worker_context.is_worker:
            return
        cw = worker_context.core_worker
        worker_context.core_worker = None
        worker_context.context = None
        if cw is not None:
            worker_context.retired_worker_ids.add(cw.worker_id)
            cw.shutdown()
            _watch_cells(on=False)
        node = worker_context.local_node
        worker_context.local_node = None
        if node is not None:
            node.stop()


def is_initialized() -> bool:
    return worker_context.core_worker is not None


# ------------------------------------------------------------------------- objects


def put(value: Any, *, _owner: Any = None) -> ObjectRef:
    """Store ``value`` in the cluster; returns its ``ObjectRef``.

    Large values (>= 100 KiB serialized) go to the node's shared-memory store, where
    numpy arrays and Arrow buffers are later read zero-copy.

    Raises:
        TypeError: ``value`` is an ObjectRef or cannot be pickled.
        ObjectStoreFullError: no room in the object store.
    """
    return worker_context.require_or_init().put(value)


def get(object_refs: ObjectRef | Sequence[ObjectRef], *, timeout: float | None = None) -> Any:
    """Wait for and return the value(s) of one ref or a list of refs.

    ``timeout``: seconds, or None (or Ray's ``-1``) to wait as long as it takes.

    Raises:
        GetTimeoutError: not ready within ``timeout`` seconds.
        TaskError: the task raised (also an instance of the user's exception class).
        WorkerCrashedError, ObjectLostError, OwnerDiedError, TaskCancelledError.
    """
    cw = worker_context.require_or_init()
    if timeout == -1:  # Ray's get() reads -1 as no timeout
        timeout = None
    _check_timeout(timeout)
    if isinstance(object_refs, ObjectRef):
        return cw.get([object_refs], timeout)[0]
    if not isinstance(object_refs, (list, tuple)):
        from lumos.generator import ObjectRefGenerator
        if isinstance(object_refs, ObjectRefGenerator):
            return object_refs  # (as Ray's get: a stream is its own value; iterate it for the refs)
        raise exc.WrongArgumentError(f"get() expects an ObjectRef or a list of ObjectRefs, got "
                                     f"{type(object_refs).__name__}{_hint(object_refs)}")
    refs = list(object_refs)
    for r in refs:
        if not isinstance(r, ObjectRef):
            raise exc.WrongArgumentError(f"get() expects a list of ObjectRefs, but it contains a "
                                         f"{type(r).__name__}{_hint(r)}")
    return cw.get(refs, timeout)


def wait(object_refs: Sequence[ObjectRef], *, num_returns: int = 1, timeout: float | None = None,
         fetch_local: bool = True) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """Wait until ``num_returns`` of the refs are ready or ``timeout`` passes.

    With ``fetch_local`` (the default, as in Ray) a value stored on another node is ready
    once it is copied into this node's store (the copy also outlives that node); with
    ``fetch_local=False`` it is ready as soon as it exists anywhere, and nothing is copied.

    Returns:
        ``(ready, not_ready)``, each in the order the refs were given (as in Ray).
    """
    cw = worker_context.require_or_init()
    if isinstance(object_refs, ObjectRef) or not isinstance(object_refs, (list, tuple)):
        raise TypeError(f"wait() expects a list of ObjectRefs, got {type(object_refs).__name__}")
    refs = list(object_refs)
    ids = set()
    add = ids.add
    generators = False
    for r in refs:
        if r.__class__ is not ObjectRef and not isinstance(r, ObjectRef):
            from lumos.generator import ObjectRefGenerator
            if not isinstance(r, ObjectRefGenerator):
                raise TypeError(f"wait() expects a list of ObjectRefs, but it contains a {type(r).__name__}")
            generators = True
            add(id(r._stream))
        else:
            add(r._id)
    if len(ids) != len(refs):
        raise ValueError("wait() requires a list of unique ObjectRefs")
    if isinstance(num_returns, bool) or not isinstance(num_returns, int) or num_returns < 1 and refs:
        raise ValueError(f"num_returns must be a positive int, got {num_returns!r}")
    _check_timeout(timeout)
    if not refs:  # as in Ray: nothing to wait for, whatever num_returns says
        return [], []
    if num_returns > len(refs):
        raise ValueError(f"num_returns ({num_returns}) cannot exceed the number of refs ({len(refs)})")
    if generators:
        return _wait_with_generators(cw, refs, num_returns, timeout, fetch_local)
    return cw.wait(refs, num_returns, timeout, fetch_local)


#: How often a wait() that holds streaming generators looks at them again.
_GENERATOR_POLL_S = 0.005


def _wait_with_generators(cw: Any, items: list[Any], num_returns: int, timeout: float | None,
                          fetch_local: bool) -> tuple[list[Any], list[Any]]:
    """``wait`` on refs and ``ObjectRefGenerator``s, as in Ray: a generator is ready when
    its next ``next()`` returns without waiting (a value's ref, or its end). Both lists
    keep the order given. (The generators are looked at every few milliseconds.)"""
    from lumos.generator import ObjectRefGenerator
    refs = [r for r in items if not isinstance(r, ObjectRefGenerator)]
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        ready_refs, _ = cw.wait(refs, len(refs), 0, fetch_local) if refs else ([], [])
        done = {id(r) for r in ready_refs}
        done.update(id(g) for g in items if isinstance(g, ObjectRefGenerator) and g._would_not_block())
        left = None if deadline is None else deadline - time.monotonic()
        if len(done) >= num_returns or (left is not None and left <= 0):
            ready = [r for r in items if id(r) in done][:num_returns]
            chosen = {id(r) for r in ready}
            return ready, [r for r in items if id(r) not in chosen]
        slice_s = _GENERATOR_POLL_S if left is None else min(_GENERATOR_POLL_S, left)
        pending = [r for r in refs if id(r) not in done]
        if pending:
            cw.wait(pending, 1, slice_s, fetch_local)
        else:
            time.sleep(slice_s)


def _check_timeout(timeout: Any) -> None:
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout must be a number of seconds or None, not {type(timeout).__name__}")
    if timeout < 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")


def cancel(object_ref: ObjectRef, *, force: bool = False, recursive: bool = True) -> None:
    """Cancel the task that produces ``object_ref``.

    A queued task never runs; a running one gets ``KeyboardInterrupt`` (``force=True``
    kills its worker process instead). ``get`` then raises ``TaskCancelledError``.
    Actor calls, as in Ray: a queued call never runs; an async actor's running call is
    cancelled as an asyncio task; a sync or threaded actor's running call is not
    interrupted (``get_runtime_context().is_canceled()`` tells it) and ``get`` raises
    ``TaskCancelledError`` once it ends; ``force=True`` is refused (``ValueError``).
    ``object_ref`` may be an ``ObjectRefGenerator`` (a streaming task).
    """
    from lumos.generator import ObjectRefGenerator
    if isinstance(object_ref, ObjectRefGenerator):  # a streaming task: cancel it by its id
        object_ref = ObjectRef(return_object_id(object_ref._stream.task_id, 1))
    elif not isinstance(object_ref, ObjectRef):
        raise TypeError(f"cancel() expects an ObjectRef, got {type(object_ref).__name__}")
    cw = worker_context.require()
    e = cw.objects.entries.get(object_ref.binary())
    if e is not None and not e.owned:
        raise ValueError("cancel() works on refs this process created (it owns the task)")
    cw.cancel(object_ref, force, recursive)  # (force=True on an actor call: ValueError)


# ------------------------------------------------------------------------- cluster


def get_node_ip_address(address: str | None = None) -> str:
    """The IP address of this process's node (the address lumos binds to), or of this
    machine when lumos is not initialized. ``address`` (Ray's: an address to route
    towards) is not used."""
    cw = worker_context.core_worker
    if cw is not None:
        return cw.node_ip  # type: ignore[no-any-return]
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def nodes() -> list[dict[str, Any]]:
    """Every node the cluster has seen, alive or dead, in Ray's format."""
    cw = worker_context.require()
    out = []
    for n in cw.call_gcs(m.GetAllNodes()):
        out.append({
            "NodeID": n.node_id.hex(), "Alive": n.state == "ALIVE", "alive": n.state == "ALIVE",
            "NodeName": n.address.host, "NodeManagerAddress": n.address.host, "NodeManagerHostname": n.hostname,
            "NodeManagerPort": n.address.port, "RayletSocketName": n.address.unix_path,
            "ObjectManagerPort": n.address.port,  # (objects move between nodes through the raylet's port)
            "ObjectStoreSocketName": n.object_store_dir,
            "Resources": {**n.resources_total, "object_store_memory": float(n.object_store_bytes)},
            "Labels": dict(n.labels), "IsHead": n.is_head, "DeathReason": n.death_reason,
            "DeathReasonMessage": n.death_reason or "",
        })
    return out


def cluster_resources() -> dict[str, float]:
    """Total resources of the alive nodes, with placement-group bundles under Ray's names."""
    cw = worker_context.require()
    total: dict[str, float] = {}
    local = cw.call_raylet(m.GetNodeStats())
    for n in cw.call_gcs(m.GetClusterStatus()):
        # Reserved placement-group bundles too, under Ray's names (CPU_group_<pg>, ...):
        # this node's as of now, others' as of their last heartbeat.
        groups = local["group_resources"][0] if n.node_id == cw.node_id else n.group_total
        for k, v in (*n.total.items(), *groups.items()):
            total[k] = total.get(k, 0) + v
        total["object_store_memory"] = total.get("object_store_memory", 0) + n.store_capacity_bytes
    return {k: float(v) for k, v in total.items()}  # (floats, as in Ray)


def available_resources() -> dict[str, float]:
    """Resources free right now (this node exact, others as of their last heartbeat)."""
    cw = worker_context.require()
    avail: dict[str, float] = {}
    local = cw.call_raylet(m.GetNodeStats())
    for n in cw.call_gcs(m.GetClusterStatus()):
        here = n.node_id == cw.node_id
        source = local["available"] if here else n.available
        groups = local["group_resources"][1] if here else n.group_available
        for k, v in (*source.items(), *groups.items()):
            if v > 0:
                avail[k] = avail.get(k, 0) + v
        # Pooled free slots (kept for reuse, given up when room is needed) count as free.
        local_used = local["store"]["used_bytes"] - local["store"].get("pool_bytes", 0)
        free = n.store_capacity_bytes - (local_used if n.node_id == cw.node_id else n.store_used_bytes)
        avail["object_store_memory"] = avail.get("object_store_memory", 0) + max(free, 0)
    return {k: float(v) for k, v in avail.items()}  # (floats, as in Ray)


def get_gpu_ids() -> list[Any]:
    """GPU ids assigned to the current task or actor (empty in the driver)."""
    cw = worker_context.require()
    gpus = cw.current_resource_ids.get("GPU") if worker_context.is_worker else None
    if not gpus:
        return []
    ex = cw.executor
    return [ex.physical_gpu(int(i)) if ex is not None else int(i) for i, _ in gpus]


def timeline(filename: str | None = None) -> list[dict[str, Any]] | None:
    """Task executions as Chrome trace events (``chrome://tracing``); written to
    ``filename`` (and None returned, as in Ray) when it is given."""
    from lumos import state
    worker_context.require_or_init()
    events = []
    for t in state.list_tasks(limit=100_000):
        if t["start_time"] and t["end_time"]:
            # One category per function, "task::<name>", as Ray's (a viewer filters on it).
            events.append({"cat": f"task::{t['name']}", "name": t["name"], "ph": "X", "pid": t["node_id"] or "?",
                           "tid": t["worker_id"] or "?", "ts": t["start_time"] * 1e6,
                           "dur": (t["end_time"] - t["start_time"]) * 1e6,
                           # Trace-viewer colours, as Ray's: failed tasks stand out.
                           "cname": "terrible" if t["state"] == "FAILED" else "generic_work",
                           "args": {"task_id": t["task_id"], "state": t["state"]}})
    if filename:
        with open(filename, "w") as f:
            json.dump(events, f)
        return None
    return events


_ = (Callable, time, exc)
