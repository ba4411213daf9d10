"""A many-node cluster on one machine, for tests (Ray's ``ray.cluster_utils.Cluster``).

Every node is a real raylet process with its own resources, worker pool and object
store directory; the head also runs the GCS. All processes die with the process that
created the ``Cluster`` (parent-death signal), and ``shutdown()`` removes their files.

    >>> from lumos.testing import Cluster
    >>> cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    >>> gpu_node = cluster.add_node(num_cpus=2, num_gpus=1, resources={"special": 1})
    >>> cluster.connect()                 # lumos.init() against it
    >>> cluster.remove_node(gpu_node)     # SIGKILL: no goodbye to the GCS
    >>> cluster.shutdown()
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

__all__ = ["Cluster", "ClusterNode"]

_NODE_ARGS = {"num_cpus", "num_gpus", "resources", "memory", "object_store_memory", "labels", "node_ip_address"}


class ClusterNode:
    """One node of a ``Cluster``: its id (hex), addresses and raylet process."""

    def __init__(self, processes: Any, resources: dict[str, float], is_head: bool) -> None:
        self._processes = processes
        #: The node's id, hex (as in ``lumos.nodes()`` and ``NodeAffinitySchedulingStrategy``).
        self.node_id: str = processes.node_id.hex()
        self.resources = resources
        self.is_head = is_head
        self.object_store_dir: str = processes.store_dir
        self.raylet_socket: str = processes.raylet_socket
        host, port = processes.raylet_address or ("", 0)
        self.node_manager_address: str = host
        self.node_manager_port: int = port
        self.removed = False

    @property
    def unique_id(self) -> str:
        return self.node_id

    @property
    def raylet_pid(self) -> int:
        proc = self._processes.raylet_proc
        return proc.pid if proc is not None else 0

    def __repr__(self) -> str:
        kind = "head" if self.is_head else "node"
        return f"ClusterNode({kind} {self.node_id[:8]}, {self.resources})"


class Cluster:
    """A head node plus any number of extra nodes on this machine.

    Args:
        initialize_head: start the head (GCS + raylet) now, with ``head_node_args``.
        connect: also call ``lumos.init()`` against it (needs ``initialize_head``).
        head_node_args: ``num_cpus``, ``num_gpus``, ``resources``, ``memory``,
            ``object_store_memory``, ``labels`` and ``_system_config`` (Config overrides
            for every process of the cluster, and for ``connect()``; e.g.
            ``{"gcs_storage": "redis://127.0.0.1:6379"}`` keeps the GCS tables in Redis).
        shutdown_at_exit: shut down at interpreter exit if still running.
    """

    def __init__(self, initialize_head: bool = False, connect: bool = False,
                 head_node_args: dict[str, Any] | None = None, shutdown_at_exit: bool = True) -> None:
        from lumos._private.node import new_session_dir
        from lumos._private.protocol import auth
        if connect and not initialize_head:
            raise ValueError("connect=True needs initialize_head=True")
        self.head_node: ClusterNode | None = None
        self.worker_nodes: list[ClusterNode] = []
        self._removed: list[ClusterNode] = []
        self._config: Any = None
        self._system_config: dict[str, Any] = {}
        self.session_dir = new_session_dir()
        self._token = auth.new_token().hex()
        self.gcs_address = ""
        self._closed = False
        if shutdown_at_exit:
            import atexit
            atexit.register(self.shutdown)
        if initialize_head:
            try:
                self.add_node(**(head_node_args or {}))
                if connect:
                    self.connect()
            except BaseException:
                self.shutdown()
                raise

    # ------------------------------------------------------------------ properties

    @property
    def address(self) -> str:
        """The GCS address, ``HOST:PORT`` (what ``lumos.init(address=...)`` takes)."""
        return self.gcs_address

    @property
    def token(self) -> str:
        """The cluster token (``lumos.init(address, _token=...)``)."""
        return self._token

    def list_all_nodes(self) -> list[ClusterNode]:
        return ([self.head_node] if self.head_node else []) + list(self.worker_nodes)

    # ------------------------------------------------------------------ nodes

    def add_node(self, wait: bool = True, **node_args: Any) -> ClusterNode:
        """Start a node (the head if there is none yet); returns its handle.

        Args: ``num_cpus`` (default 1), ``num_gpus`` (default 0), ``resources``,
        ``memory``, ``object_store_memory`` (default 256 MiB), ``labels``; for the head
        also ``_system_config``.
        """
        from lumos._private.config import Config
        from lumos._private.node import NodeProcesses, node_resources
        if self._closed:
            raise RuntimeError("this Cluster was shut down")
        system_config = node_args.pop("_system_config", None)
        unknown = set(node_args) - _NODE_ARGS
        if unknown:
            raise TypeError(f"add_node() got unexpected arguments {sorted(unknown)}; "
                            f"valid: {sorted(_NODE_ARGS | {'_system_config'})}")
        is_head = self.head_node is None
        if system_config is not None:
            if not is_head:
                raise ValueError("_system_config applies to the whole cluster: give it with the head's arguments")
            self._system_config = dict(system_config)
        if self._config is None:
            self._config = Config.resolve(self._system_config)
        ip = node_args.get("node_ip_address", "127.0.0.1")
        resources = node_resources(node_args.get("num_cpus", 1), node_args.get("num_gpus", 0),
                                   node_args.get("resources"), node_args.get("memory"))
        resources[f"node:{ip}"] = 1.0
        store = int(node_args.get("object_store_memory") or 256 * 1024 * 1024)
        labels = node_args.get("labels")
        procs = NodeProcesses(self.session_dir, self._config)
        if is_head:
            procs.write_token(self._token.encode())
            resources["node:__internal_head__"] = 1.0
        try:
            if is_head:
                procs.start_gcs_and_raylet(resources=resources, store_bytes=store, host=ip, gcs_port=0,
                                           private=False, tie_to_parent=True, labels=labels)
                assert procs.gcs_address is not None
                self.gcs_address = f"{procs.gcs_address[0]}:{procs.gcs_address[1]}"
            else:
                procs.start_raylet(self.gcs_address, resources=resources, store_bytes=store, host=ip,
                                   tie_to_parent=True, labels=labels)
        except BaseException:
            procs.stop(remove_sockets=is_head)
            raise
        node = ClusterNode(procs, resources, is_head)
        if is_head:
            self.head_node = node
        else:
            self.worker_nodes.append(node)
        if wait and not is_head:
            self._wait_alive(node.node_id, 30.0)
        return node

    def remove_node(self, node: ClusterNode, allow_graceful: bool = False) -> None:
        """Kill ``node``'s raylet (SIGKILL unless ``allow_graceful``); its workers die with it.

        Removing the head kills the GCS too, which ends the cluster.
        """
        if node.removed:
            return
        procs = node._processes
        workers = _worker_ids_of(node.raylet_pid)
        if allow_graceful:
            procs.stop(remove_sockets=False)
        else:
            procs.kill_raylet()
            if node.is_head and procs.gcs_proc is not None and procs.gcs_proc.poll() is None:
                procs.gcs_proc.kill()
                procs.gcs_proc.wait(5.0)
        for wid in workers:
            try:
                os.unlink(os.path.join(self.session_dir, "sockets", f"worker-{wid[:12]}.sock"))
            except FileNotFoundError:
                pass
        node.removed = True
        if node in self.worker_nodes:
            self.worker_nodes.remove(node)
        elif node is self.head_node:
            self.head_node = None
        self._removed.append(node)

    def kill_gcs(self) -> None:
        """SIGKILL the head's GCS, leaving its raylet and the other nodes be."""
        procs = self._head_processes()
        if procs.gcs_proc is not None and procs.gcs_proc.poll() is None:
            procs.gcs_proc.kill()
            procs.gcs_proc.wait(5.0)

    def restart_gcs(self, timeout_s: float = 30.0) -> None:
        """Start the GCS again on its address, with its session and storage (after ``kill_gcs``).

        With ``gcs_storage`` on Redis it reloads its tables; with memory it starts empty.
        Call it from the thread that keeps running: the GCS dies with the thread that
        started it (parent-death signal).
        """
        procs = self._head_processes()
        if procs.gcs_proc is not None and procs.gcs_proc.poll() is None:
            raise RuntimeError("the GCS is still running: kill_gcs() first")
        args, tie = procs.gcs_spawn_args
        args = list(args)
        args[args.index("--port") + 1] = self.gcs_address.rpartition(":")[2]
        proc, fd = procs._spawn(args, tie_to_parent=tie)
        procs.gcs_proc = proc
        procs._await_ready(proc, fd, "gcs", timeout_s)

    def _head_processes(self) -> Any:
        if self.head_node is None:
            raise RuntimeError("the cluster has no head node")
        return self.head_node._processes

    def wait_for_nodes(self, timeout: float = 30.0) -> None:
        """Wait until the GCS lists every node of this Cluster as alive."""
        for node in self.list_all_nodes():
            self._wait_alive(node.node_id, timeout)

    def _wait_alive(self, node_id_hex: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            alive = {n.node_id.hex() for n in self._gcs_nodes() if n.state == "ALIVE"}
            if node_id_hex in alive:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {node_id_hex[:8]} did not register with the GCS in {timeout_s:.0f}s")
            time.sleep(0.05)

    def _gcs_nodes(self) -> list[Any]:
        from lumos.api import _fetch_nodes
        from lumos._private.transport.connection import parse_address
        return _fetch_nodes(self._config, self._token.encode(), parse_address(self.gcs_address))

    # ------------------------------------------------------------------ driver

    def connect(self, namespace: str | None = None, **init_args: Any) -> Any:
        """``lumos.init()`` against this cluster (from the head node's raylet)."""
        import lumos
        if not self.gcs_address:
            raise RuntimeError("the cluster has no head node yet")
        config = dict(self._system_config)
        config.update(init_args.pop("_system_config", {}))
        return lumos.init(address=self.gcs_address, _token=self._token, namespace=namespace,
                          _system_config=config, **init_args)

    def shutdown(self) -> None:
        """Disconnect this process's driver (if connected here) and stop every node."""
        if self._closed:
            return
        self._closed = True
        import lumos
        from lumos._private import worker_context
        ctx = worker_context.context
        if ctx is not None and getattr(ctx, "address_info", {}).get("gcs_address") == self.gcs_address:
            lumos.shutdown()
        for node in list(self.worker_nodes):
            node._processes.stop(timeout_s=2.0, remove_sockets=False)
            node.removed = True
        if self.head_node is not None:
            self.head_node._processes.stop(timeout_s=2.0, remove_sockets=True)
            self.head_node.removed = True
        for node in self._removed:
            shutil.rmtree(node.object_store_dir, ignore_errors=True)
        self.worker_nodes = []
        self.head_node = None
        shutil.rmtree(os.path.join(self.session_dir, "sockets"), ignore_errors=True)

    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return f"Cluster(address={self.gcs_address!r}, nodes={len(self.list_all_nodes())})"


def _worker_ids_of(raylet_pid: int) -> list[str]:
    """Worker ids (hex) of a raylet's worker processes, read from their command lines."""
    import psutil
    out = []
    try:
        children = psutil.Process(raylet_pid).children()
    except psutil.Error:
        return []
    for child in children:
        try:
            cmd = child.cmdline()
        except psutil.Error:
            continue
        if "--worker-id" in cmd:
            i = cmd.index("--worker-id")
            if i + 1 < len(cmd):
                out.append(cmd[i + 1])
    return out

