"""The ``lumos`` command: ``demo``, ``start``, ``stop``, ``status``.

```
lumos start --head [--port P] ...        GCS + raylet, detached; writes current_cluster.json
lumos start --address H:P --token-file F a raylet that joins the GCS at H:P
lumos status [--address H:P]             nodes, resources (available/total), dashboard
lumos stop                               ends what `lumos start` started on this machine
lumos demo [WORKLOAD]                    the paper's workloads on a private local cluster (--list)
lumos slurm --nodes N ...                a cluster as a Slurm batch job (lumos.launch.slurm)
lumos kubernetes manifest|probe          Kubernetes manifests and readiness probe (lumos.launch.kubernetes)
```
Every node ``lumos start`` starts is recorded under ``<root>/started/`` (pids with
their start times; the root is private to this user, see ``lumos._private.node``);
``lumos stop`` signals exactly those processes, never anything found by name.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any, Sequence

DEFAULT_PORT = 6379


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    from lumos._private.process import UnsafePathError
    try:
        return int(args.func(args) or 0)
    except (_CliError, UnsafePathError) as e:  # (a root another user made: the text says what to do)
        print(f"lumos {args.command}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


class _CliError(Exception):
    """A failure the user can act on; printed without a traceback."""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lumos", description="lumos cluster command line")
    sub = p.add_subparsers(dest="command")

    demo = sub.add_parser("demo", help="run one of the paper's workloads on a private local cluster",
                          description="Run a workload of the Ray paper on a private local cluster "
                                      "(default: evolution strategies). `lumos demo --list` shows them all.")
    demo.add_argument("workload", nargs="?", default="es", help="es (default), ppo, allreduce, serving or hpo")
    demo.add_argument("--list", action="store_true", help="list the workloads and exit")
    demo.add_argument("--workers", type=int, default=None, help="worker actors (default: the workload's)")
    demo.add_argument("--iterations", type=int, default=None, help="iterations (default: the workload's)")
    demo.add_argument("--num-cpus", type=float, default=None, help="CPUs of the private cluster")
    demo.add_argument("--dashboard", action="store_true",
                      help="start the live dashboard and print its link (waits for Enter at the end on a terminal)")
    demo.set_defaults(func=cmd_demo)

    start = sub.add_parser("start", help="start a head node, or a node that joins a cluster")
    start.add_argument("--head", action="store_true", help="start the GCS and this node's raylet")
    start.add_argument("--address", default=None, help="HOST:PORT of the head's GCS to join")
    _token_options(start)
    start.add_argument("--port", type=int, default=DEFAULT_PORT, help="GCS port of a head node (0: any free)")
    start.add_argument("--node-ip-address", default="127.0.0.1",
                       help="address this node listens on and advertises (default 127.0.0.1)")
    start.add_argument("--num-cpus", type=float, default=None)
    start.add_argument("--num-gpus", type=float, default=None)
    start.add_argument("--memory", type=int, default=None)
    start.add_argument("--resources", default=None, help='custom resources as JSON, e.g. \'{"TPU": 4}\'')
    start.add_argument("--labels", default=None, help="node labels as JSON")
    start.add_argument("--object-store-memory", type=int, default=None, help="store capacity in bytes")
    start.add_argument("--include-dashboard", dest="no_dashboard", action="store_false", default=None)
    start.add_argument("--no-dashboard", dest="no_dashboard", action="store_true")
    start.add_argument("--dashboard-host", default="127.0.0.1")
    start.add_argument("--dashboard-port", type=int, default=8265)
    start.add_argument("--client-server-port", type=int, default=10001,
                       help="head: port of the client server for lumos://HOST:PORT drivers (0: any free)")
    start.add_argument("--no-client-server", action="store_true",
                       help="head: start no client server (no lumos:// drivers)")
    start.add_argument("--gcs-storage", default=None, metavar="URL",
                       help="where the GCS keeps its tables: memory (default), or "
                            "redis://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...] (sharded over the servers "
                            "listed; a restarted GCS recovers its tables)")
    start.add_argument("--system-config", default=None, help="JSON overrides of lumos Config fields")
    start.add_argument("--block", action="store_true", help="stay in the foreground; Ctrl-C stops the node")
    start.set_defaults(func=cmd_start)

    stop = sub.add_parser("stop", help="stop the lumos processes `lumos start` started on this machine")
    stop.add_argument("--grace-period", type=float, default=5.0, help="seconds before SIGKILL")
    stop.set_defaults(func=cmd_stop)

    status = sub.add_parser("status", help="nodes of the cluster and their resources")
    status.add_argument("--address", default=None, help="HOST:PORT of the GCS (default: this machine's)")
    _token_options(status)
    status.add_argument("--json", action="store_true", help="print machine-readable JSON")
    status.set_defaults(func=cmd_status)
    _add_launch_commands(sub)
    return p


def _token_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--token-file", default=None, metavar="PATH",
                   help="file holding the cluster token (the head's <session>/token); "
                        "or set LUMOS_CLUSTER_TOKEN")
    p.add_argument("--token", default=None,
                   help="the cluster token itself; visible to every local user in /proc: "
                        "prefer --token-file or LUMOS_CLUSTER_TOKEN")


def _token_arg(args: argparse.Namespace) -> str | None:
    """The cluster token from ``--token-file``, ``--token`` or ``LUMOS_CLUSTER_TOKEN``, or None."""
    if args.token_file and args.token:
        raise _CliError("give the token once: --token-file or --token, not both")
    if args.token_file:
        import stat
        try:
            with open(args.token_file, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                text = f.read(4096).decode().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise _CliError(f"cannot read the token file {args.token_file}: {e}") from None
        if not text:
            raise _CliError(f"the token file {args.token_file} is empty")
        if mode & 0o077:
            print(f"lumos {args.command}: warning: the token file {args.token_file} is readable by other "
                  f"users (mode {stat.S_IMODE(mode):o}); run `chmod 600 {args.token_file}`", file=sys.stderr)
        return text
    if args.token:
        print(f"lumos {args.command}: warning: --token puts the cluster token on the command line, where every "
              "local user can read it (/proc/PID/cmdline); use --token-file PATH or LUMOS_CLUSTER_TOKEN",
              file=sys.stderr)
        return str(args.token)
    return os.environ.get("LUMOS_CLUSTER_TOKEN") or None


# ----------------------------------------------------------------------------- demo


def cmd_demo(args: argparse.Namespace) -> int:
    import inspect

    from lumos import examples

    if args.list:
        print("lumos demo WORKLOAD [--workers N] [--iterations N] [--dashboard]; workloads:")
        for name, what in examples.WORKLOADS.items():
            print(f"  {name:<10} {what}")
        print("Each is a module reusable from Python, e.g. `from lumos.examples import es; es.run(workers=4)`.")
        return 0
    if args.workload not in examples.WORKLOADS:
        raise _CliError(f"unknown workload {args.workload!r}; choose one of {', '.join(examples.WORKLOADS)} "
                        "(`lumos demo --list`)")
    for name in ("workers", "iterations"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise _CliError(f"--{name} must be at least 1, got {value}")
    module = examples.load(args.workload)
    params = inspect.signature(module.run).parameters
    kwargs: dict[str, Any] = {name: getattr(args, name) for name in ("workers", "iterations")
                              if getattr(args, name) is not None}
    workers = kwargs.get("workers", params["workers"].default)
    if args.workload == "allreduce" and workers < 2:
        raise _CliError("allreduce needs --workers 2 or more")

    import lumos

    print(f"lumos demo {args.workload}: {examples.WORKLOADS[args.workload]}")
    t0 = time.perf_counter()
    ctx = lumos.init(num_cpus=args.num_cpus, include_dashboard=bool(args.dashboard))
    try:
        cpus = lumos.cluster_resources().get("CPU", 0)
        print(f"private local cluster: {cpus:g} CPUs, {workers} workers")
        if args.dashboard:
            url = getattr(ctx, "dashboard_url", "") or ""
            print(f"dashboard: {url}" if url else "dashboard: did not start (see the session's logs)")
        result = module.run(lumos, report=_print_progress, **kwargs)
        for line in result.summary():
            print(line)
        if args.dashboard and sys.stdin.isatty():
            input("press Enter to stop the cluster and its dashboard ")
    finally:
        lumos.shutdown()
    print(f"total: {time.perf_counter() - t0:.2f} s including cluster start and stop")
    return 0


def _print_progress(r: dict[str, Any]) -> None:
    """One line per iteration of a demo workload."""
    shown = []
    for key, value in r.items():
        if key == "elapsed_s":
            continue
        if isinstance(value, float):
            value = f"{value * 1e3:.1f} ms" if key.endswith("_s") and "_per_" not in key else f"{value:.4g}"
        shown.append(f"{key} {value}")
    print(f"[{r.get('elapsed_s', 0.0):6.2f} s] " + "  ".join(shown), flush=True)


# ----------------------------------------------------------------------------- start


def _json_arg(text: str | None, what: str) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise _CliError(f"{what} is not valid JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise _CliError(f"{what} must be a JSON object, got {text!r}")
    return value


def cmd_start(args: argparse.Namespace) -> int:
    from lumos._private.config import Config
    from lumos._private.node import (NodeProcesses, check_node_labels, default_store_bytes, new_session_dir,
                                     node_resources, process_identity, record_started_node,
                                     write_current_cluster)
    from lumos._private.protocol import auth

    if args.head == bool(args.address):
        raise _CliError("give either --head (start a new cluster) or --address HOST:PORT (join one)")
    resources = _json_arg(args.resources, "--resources")
    for k, v in resources.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise _CliError(f"--resources: amount of {k!r} must be a number >= 0, got {v!r}")
    labels = {str(k): str(v) for k, v in _json_arg(args.labels, "--labels").items()}
    try:
        check_node_labels(labels)
    except ValueError as e:
        raise _CliError(f"--labels: {e}") from None
    for name, value in (("--num-cpus", args.num_cpus), ("--num-gpus", args.num_gpus),
                        ("--object-store-memory", args.object_store_memory), ("--memory", args.memory)):
        if value is not None and value < 0:
            raise _CliError(f"{name} must be >= 0, got {value}")
    overrides = _json_arg(args.system_config, "--system-config")
    if args.gcs_storage is not None:
        from lumos._private.gcs.storage import check_storage_url
        try:
            check_storage_url(args.gcs_storage)
        except ValueError as e:
            raise _CliError(f"--gcs-storage: {e}") from None
        overrides = {**overrides, "gcs_storage": args.gcs_storage}
    try:
        config = Config.resolve(overrides)
        res = node_resources(args.num_cpus, args.num_gpus, resources, args.memory)
    except (ValueError, TypeError) as e:
        raise _CliError(str(e)) from None
    ip = args.node_ip_address
    res[f"node:{ip}"] = 1.0

    if args.head:
        existing = _live_head()
        if existing is not None:
            raise _CliError(f"a lumos cluster started here is already running at {existing['gcs_address']}; "
                            "run `lumos stop` first")
        token = auth.new_token().hex().encode()
    else:
        token_text = _token_arg(args)
        if not token_text:
            raise _CliError("joining a cluster needs its token: --token-file PATH (a copy of the head's token "
                            "file, printed by `lumos start --head`) or LUMOS_CLUSTER_TOKEN")
        token = token_text.strip().encode()
        from lumos._private.transport.connection import parse_address
        try:
            gcs = parse_address(args.address)
        except ValueError as e:
            raise _CliError(str(e)) from None
        _check_gcs(config, token, gcs, args.address)

    store = args.object_store_memory or config.object_store_memory or default_store_bytes()
    session_dir = new_session_dir()
    node = NodeProcesses(session_dir, config)
    node.write_token(token)
    dashboard_url = ""
    client_address = ""
    keeper = False
    try:
        if args.head:
            res["node:__internal_head__"] = 1.0
            # A GCS on durable storage runs under a keeper that restarts it when it dies.
            keeper = config.gcs_storage != "memory" and config.gcs_restart_on_failure
            node.start_gcs_and_raylet(resources=res, store_bytes=store, host=ip, gcs_port=args.port,
                                      private=False, labels=labels, keeper=keeper)
            assert node.gcs_address is not None
            gcs_address = f"{node.gcs_address[0]}:{node.gcs_address[1]}"
            if not args.no_dashboard:
                try:
                    dashboard_url = _start_dashboard(args, node, gcs_address, token)
                except Exception as e:  # the cluster is useful without its dashboard
                    print(f"lumos: the dashboard did not start ({e}); continuing without it", file=sys.stderr)
            if not args.no_client_server:
                client_address = _start_client_server(args, node, gcs_address, overrides)
        else:
            gcs_address = args.address
            node.start_raylet(gcs_address, resources=res, store_bytes=store, host=ip, tie_to_parent=False,
                              labels=labels)
    except BaseException as e:
        # Whatever went wrong, nothing this command started may outlive it unrecorded.
        node.stop()
        _remove_session(session_dir)
        if isinstance(e, (RuntimeError, TimeoutError, OSError)):
            raise _CliError(f"could not start the node: {e}") from None
        raise
    # Dashboard and raylet first, then the GCS.
    processes = [process_identity(p.pid) for p in reversed(node.procs)]
    record = {"node_id": node.node_id.hex(), "head": bool(args.head), "gcs_address": gcs_address,
              "session_dir": session_dir, "token_path": node.token_path, "store_dir": node.store_dir,
              "raylet_socket": node.raylet_socket, "processes": processes,
              "pids": [p["pid"] for p in processes], "dashboard_url": dashboard_url,
              "client_address": client_address, "gcs_keeper": bool(args.head and keeper),
              "started": time.time()}
    record_started_node(record)
    if args.head or _live_head() is None:
        # ``lumos.init(address="auto")`` on this machine reads this file (and the token file).
        write_current_cluster(record)
    _print_started(args, record, token.decode())
    if args.block:
        return _block(node, record)
    return 0


def _start_dashboard(args: argparse.Namespace, node: Any, gcs_address: str, token: bytes) -> str:
    """Start the head's dashboard (outliving this command); returns its login URL, or "" on failure."""
    from lumos._private.dashboard_process import DashboardStartError, start_dashboard
    try:
        proc, url = start_dashboard(node.session_dir, f"unix:{node.gcs_unix}", node.token_path,
                                    args.dashboard_host, args.dashboard_port, private=False)
    except (DashboardStartError, ValueError, OSError) as e:
        print(f"lumos start: warning: the cluster runs without its dashboard: {e}", file=sys.stderr)
        return ""
    node.procs.append(proc)  # recorded with the others, so `lumos stop` ends it
    return url


def _start_client_server(args: argparse.Namespace, node: Any, gcs_address: str, overrides: dict[str, Any]) -> str:
    """Start the head's client server (outliving this command); returns ``lumos://HOST:PORT``, or ""."""
    from lumos._private.client.launch import start_client_server
    try:
        return start_client_server(node, args.node_ip_address, args.client_server_port, gcs_address, overrides,
                                   tie_to_parent=False)
    except (RuntimeError, TimeoutError) as e:
        print(f"lumos start: warning: no client server (lumos:// drivers cannot connect): {e}", file=sys.stderr)
        return ""


def _metrics_url(dashboard_url: str) -> str:
    """The dashboard's Prometheus endpoint, from its login link."""
    from urllib.parse import urlsplit, urlunsplit
    parts = urlsplit(dashboard_url)
    return urlunsplit((parts.scheme, parts.netloc, "/metrics", "", ""))


def _print_started(args: argparse.Namespace, record: dict[str, Any], token: str) -> None:
    addr = record["gcs_address"]
    if args.head:
        print(f"lumos head node started: GCS at {addr}, node {record['node_id'][:8]}")
    else:
        print(f"lumos node {record['node_id'][:8]} joined the cluster at {addr}")
    print(f"  session directory: {record['session_dir']}")
    if record.get("dashboard_url"):
        print(f"  dashboard: {record['dashboard_url']}")
        print(f"  metrics (Prometheus): {_metrics_url(record['dashboard_url'])} with the login link's token as "
              "'Authorization: Bearer TOKEN'")
    if record.get("client_address"):
        print(f"  client address: {record['client_address']}")
    if args.head:
        print("\nTo connect from Python on this machine:\n"
              "    import lumos\n"
              "    lumos.init(address=\"auto\")\n"
              "\nTo join another node (run on that machine, with a copy of the token file, mode 600):\n"
              f"    lumos start --address {addr} --token-file PATH\n"
              "  or with the token in the environment (not on a command line, where other users see it):\n"
              f"    export LUMOS_CLUSTER_TOKEN={token}\n"
              f"    lumos start --address {addr}\n"
              "\nFrom a driver elsewhere (that machine must run a node), with LUMOS_CLUSTER_TOKEN set:\n"
              f"    lumos.init(address=\"{addr}\")\n"
              + (f"\nFrom a machine with no lumos node (client mode), with a copy of the token file:\n"
                 f"    lumos.init(\"{record['client_address']}\", _token=\"PATH\")\n"
                 if record.get("client_address") else "")
              + f"\nThe token is in {record['token_path']}.")
    print("Stop with `lumos stop`; inspect with `lumos status`.")


def _block(node: Any, record: dict[str, Any]) -> int:
    from lumos._private.node import started_dir, stop_recorded_node
    stopping = False

    def on_signal(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    while not stopping and all(p.poll() is None for p in node.procs if hasattr(p, "poll")):
        time.sleep(0.2)
    stop_recorded_node(record)
    _forget(record, os.path.join(started_dir(), f"{record['node_id']}.json"))
    return 0


def _live_head() -> dict[str, Any] | None:
    from lumos._private.node import read_current_cluster, recorded_alive
    record = read_current_cluster()
    return record if record is not None and recorded_alive(record) else None


def _check_gcs(config: Any, token: bytes, gcs: Any, text: str) -> list[Any]:
    """Ask the GCS for its nodes: proves it is reachable and accepts ``token``."""
    try:
        return _gcs_call(config, token, gcs, "GetAllNodes")
    except ConnectionError as e:
        raise _CliError(str(e)) from None


def _gcs_call(config: Any, token: bytes, gcs: Any, what: str, *fields: Any) -> Any:
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import ConnectionLost, connect

    async def ask() -> Any:
        try:
            conn = await connect(gcs, token=token, config=config, name="cli->gcs")
        except ConnectionLost:
            raise ConnectionError(f"the GCS at {_fmt(gcs)} refused the connection during authentication: "
                                  "the cluster token is wrong (use the token `lumos start --head` printed)") from None
        try:
            return await conn.call(getattr(m, what)(*fields), config.rpc_timeout_s)
        finally:
            conn.close()

    from lumos.api import _run_on_own_loop
    try:  # on a loop of its own: the caller's thread may run one (a notebook cell calling main())
        return _run_on_own_loop(ask, config.connect_timeout_s + config.rpc_timeout_s + 5)
    except (OSError, TimeoutError) as e:
        if isinstance(e, ConnectionError) and "authentication" in str(e):
            raise
        raise ConnectionError(f"cannot reach the lumos GCS at {_fmt(gcs)}: {e or type(e).__name__}") from None


def _fmt(gcs: Any) -> str:
    return f"{gcs[0]}:{gcs[1]}" if isinstance(gcs, tuple) else f"unix:{gcs}"


def _remove_session(session_dir: str) -> None:
    import shutil
    shutil.rmtree(session_dir, ignore_errors=True)


def _forget(record: dict[str, Any], path: str) -> None:
    from lumos._private.node import forget_current_cluster
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    forget_current_cluster(str(record.get("node_id")))


# ----------------------------------------------------------------------------- stop


def cmd_stop(args: argparse.Namespace) -> int:
    from lumos._private.node import forget_current_cluster, started_nodes, stop_recorded_node
    records = started_nodes()
    if not records:
        print("no lumos processes started by `lumos start` on this machine")
        forget_current_cluster()
        return 0
    # Worker nodes first, so they are not left reconnecting to a GCS that is going away.
    records.sort(key=lambda pr: bool(pr[1].get("head")))
    total = 0
    for path, record in records:
        pids = stop_recorded_node(record, args.grace_period)
        total += len(pids)
        _forget(record, path)
        kind = "head node" if record.get("head") else "node"
        print(f"stopped {kind} {str(record.get('node_id', '?'))[:8]} ({len(pids)} processes)")
    forget_current_cluster()
    print(f"stopped {len(records)} node(s), {total} process(es)")
    return 0


# ----------------------------------------------------------------------------- status


def cmd_status(args: argparse.Namespace) -> int:
    from lumos._private.config import Config
    from lumos._private.node import read_current_cluster
    from lumos._private.process import read_private_file
    from lumos._private.transport.connection import parse_address
    from lumos.state import labels_text

    config = Config.resolve()
    address, token_text, dashboard = args.address, _token_arg(args), ""
    current: dict[str, Any] = read_current_cluster() or {}
    if address is None:
        if not current:
            raise _CliError("no lumos cluster was started on this machine; "
                            "pass --address HOST:PORT and --token-file PATH, or run `lumos start --head`")
        address = current["gcs_address"]
    if not token_text and current.get("gcs_address") == address:
        try:
            token_text = read_private_file(current["token_path"]).decode().strip()
        except (OSError, KeyError, UnicodeDecodeError):
            pass
    if not token_text:
        raise _CliError(f"the cluster at {address} needs its token: --token-file PATH or LUMOS_CLUSTER_TOKEN")
    try:
        gcs = parse_address(address)
    except ValueError as e:
        raise _CliError(str(e)) from None
    token = token_text.encode()
    try:
        nodes = _gcs_call(config, token, gcs, "GetAllNodes")
        loads = {r.node_id: r for r in _gcs_call(config, token, gcs, "GetClusterStatus")}
        storage = _gcs_call(config, token, gcs, "KvGet", "cluster", b"gcs_storage_health", 0.0)
    except ConnectionError as e:
        raise _CliError(str(e)) from None
    storage_health = storage.decode() if storage else "ok"
    dashboard = next((n.dashboard_url for n in nodes if n.dashboard_url), "") or current.get("dashboard_url", "")
    if args.json:
        print(json.dumps({"gcs_address": address, "dashboard_url": dashboard,
                          "gcs_storage_health": storage_health, "nodes": [
            _node_json(n, loads.get(n.node_id)) for n in nodes]}, indent=1))
        return 0
    alive = [n for n in nodes if n.state == "ALIVE"]
    print(f"lumos cluster at {address}: {len(alive)} node(s) alive, {len(nodes) - len(alive)} dead")
    print(f"dashboard: {dashboard}" if dashboard else "dashboard: none")
    if dashboard:
        print(f"metrics (Prometheus): {_metrics_url(dashboard)} (the login link's token as a bearer token)")
    if storage_health != "ok":
        print(f"GCS UNHEALTHY: its storage is {storage_health}")
    total: dict[str, float] = {}
    avail: dict[str, float] = {}
    for n in nodes:
        load = loads.get(n.node_id)
        head = " (head)" if n.is_head else ""
        print(f"\nnode {n.node_id.hex()[:12]}{head}  {n.state}  {n.address.host}:{n.address.port}  "
              f"host {n.hostname}")
        if n.state != "ALIVE":
            print(f"  died: {n.death_reason}")
            continue
        shown = labels_text(n.labels)
        if shown:
            print(f"  {'labels':<20} {shown}")
        avail_now = load.available if load else n.resources_total
        for name, amount in sorted(n.resources_total.items()):
            if name.startswith("node:"):
                continue
            free = avail_now.get(name, 0.0)
            total[name] = total.get(name, 0.0) + amount
            avail[name] = avail.get(name, 0.0) + free
            print(f"  {name:<20} {_amount(name, free)} / {_amount(name, amount)} available")
        if load is not None:
            pooled = (f" (+{load.store_pooled_bytes / 2**20:.1f} MiB of freed slots kept for reuse)"
                      if load.store_pooled_bytes else "")
            print(f"  {'object_store':<20} {load.store_used_bytes / 2**20:.1f} MiB used / "
                  f"{load.store_capacity_bytes / 2**20:.1f} MiB{pooled}")
            print(f"  {'workers':<20} {load.num_workers}   queued lease requests: {load.queue_length}")
            for shape in load.infeasible:
                print(f"  infeasible request pending: {shape}")
    if alive:
        print("\ncluster total (available / total):")
        for name in sorted(total):
            print(f"  {name:<20} {_amount(name, avail[name])} / {_amount(name, total[name])}")
    return 0


def _amount(name: str, value: float) -> str:
    if name == "memory":
        return f"{value / 2**30:.2f} GiB"
    return f"{value:g}"


def _node_json(n: Any, load: Any) -> dict[str, Any]:
    return {"node_id": n.node_id.hex(), "state": n.state, "is_head": n.is_head,
            "address": f"{n.address.host}:{n.address.port}", "hostname": n.hostname,
            "resources_total": dict(n.resources_total),
            "resources_available": dict(load.available) if load else {},
            "queue_length": load.queue_length if load else 0, "labels": dict(n.labels),
            "death_reason": n.death_reason, "dashboard_url": n.dashboard_url}


# ----------------------------------------------------------------------------- slurm, kubernetes


def _add_launch_commands(sub: Any) -> None:
    """``lumos slurm`` and ``lumos kubernetes`` (their code lives in ``lumos.launch``)."""
    from lumos.launch import kubernetes, slurm

    p = sub.add_parser("slurm", help="start a lumos cluster as a Slurm batch job (sbatch + srun)")
    slurm.add_arguments(p)
    p.set_defaults(func=slurm.run)
    k = sub.add_parser("kubernetes", help="Kubernetes manifests for a lumos cluster, and its readiness probe")
    kubernetes.add_arguments(k)
    k.set_defaults(func=kubernetes.run)


if __name__ == "__main__":
    sys.exit(main())
