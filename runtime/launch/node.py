"""One lumos node in the foreground: the process a Slurm step or a container runs.

```
python -m lumos.launch.node --head --token-file F [--port P] [--address-file A] ...
python -m lumos.launch.node --address HOST:PORT --token-file F ...
```

Unlike ``lumos start`` it records nothing machine-wide (no ``current_cluster.json``, no
``lumos stop`` record: the engine owns the node's lifecycle, and two jobs of one user may
share a machine), takes the token only from a file or ``LUMOS_CLUSTER_TOKEN`` (never on
its command line, which other users can read), and stays in the foreground:

```
engine (srun / kubelet) ──► node runner ──► GCS, client server, dashboard (head only), raylet
      SIGTERM ──────────────►  stops them, exits 0
                               a child died ──► stops the rest, exits 1 (the engine sees it)
```

A joining node waits for the GCS (``--join-timeout-s``): Kubernetes starts worker pods
without waiting for the head. A head can write its GCS address (``--address-file``) and
its dashboard's login link (``--dashboard-file``, 0600) and its client server's
``lumos://HOST:PORT`` (``--client-file``; ``--client-server-port``, default 10001) for
the launcher, and
``--wait-for-nodes N`` starts nothing but waits for a cluster of N nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Sequence

#: Exit status when one of the node's processes died on its own.
EXIT_CHILD_DIED = 1
#: Exit status for bad arguments or a cluster that could not be reached.
EXIT_USAGE = 2


class NodeStartError(RuntimeError):
    """The node could not start: bad arguments, no token, GCS unreachable."""


def read_token(token_file: str | None, environ: dict[str, str] | os._Environ[str]) -> bytes:
    """The cluster token from ``token_file``, else ``LUMOS_CLUSTER_TOKEN``.

    Raises:
        NodeStartError: neither is given, or the file cannot be read or is too short.
    """
    if token_file:
        try:
            with open(token_file, "rb") as f:
                mode = os.fstat(f.fileno()).st_mode
                token = f.read(4096).strip()
        except OSError as e:
            raise NodeStartError(f"cannot read the cluster token file {token_file}: {e.strerror}") from None
        if mode & 0o007:
            # Group-readable is how Kubernetes shares a Secret with the pod's fsGroup; others is not.
            print(f"lumos node: warning: the token file {token_file} is readable by every local user "
                  f"(mode {mode & 0o777:o}); run `chmod 600 {token_file}`", file=sys.stderr, flush=True)
        where = token_file
    else:
        token = environ.get("LUMOS_CLUSTER_TOKEN", "").strip().encode()
        where = "LUMOS_CLUSTER_TOKEN"
        if not token:
            raise NodeStartError("no cluster token: pass --token-file PATH or set LUMOS_CLUSTER_TOKEN")
    if len(token) < 16:
        raise NodeStartError(f"the cluster token in {where} is too short ({len(token)} bytes; "
                             "generate one with `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return token


def slurm_node_ip(nodename: str, timeout_s: float = 30.0) -> str:
    """The address Slurm reaches ``nodename`` at (its ``NodeAddr``), resolved to an IP."""
    try:
        out = subprocess.run(["scontrol", "show", "node", nodename, "-o"], capture_output=True, text=True,
                             timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise NodeStartError(f"cannot ask Slurm for the address of node {nodename}: {e}") from None
    for field in out.stdout.split():
        if field.startswith("NodeAddr="):
            return socket.gethostbyname(field.split("=", 1)[1])
    raise NodeStartError(f"`scontrol show node {nodename}` gave no NodeAddr (exit {out.returncode}: "
                         f"{out.stderr.strip()}); pass --node-ip-address")


def auto_node_ip(environ: dict[str, str] | os._Environ[str], gcs: tuple[str, int] | None) -> str:
    """This node's address when none is given: Slurm's ``NodeAddr`` inside a Slurm step,
    else the local address of the route to the GCS, else the host name's address."""
    nodename = environ.get("SLURMD_NODENAME")
    if nodename:
        return slurm_node_ip(nodename)
    if gcs is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                s.connect((socket.gethostbyname(gcs[0]), gcs[1]))  # no packet is sent
                return str(s.getsockname()[0])
            except OSError:
                pass
    return socket.gethostbyname(socket.gethostname())


async def _ask_gcs(gcs: tuple[str, int], token: bytes, config: Any, timeout_s: float) -> list[Any]:
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import connect
    async with asyncio.timeout(timeout_s):
        conn = await connect(gcs, token=token, config=config, name="launch->gcs", timeout_s=timeout_s)
        try:
            return list(await conn.call(m.GetAllNodes(), timeout_s))
        finally:
            conn.close()


def gcs_nodes(gcs: tuple[str, int], token: bytes, config: Any, timeout_s: float = 10.0) -> list[Any]:
    """The GCS's node table, over an authenticated connection.

    Raises:
        PermissionError: the GCS refused the token.
        ConnectionError: the GCS cannot be reached or did not answer in ``timeout_s``.
    """
    from lumos._private.transport.connection import ConnectionLost
    where = f"{gcs[0]}:{gcs[1]}"
    try:
        return asyncio.run(_ask_gcs(gcs, token, config, timeout_s))
    except ConnectionLost:
        raise PermissionError(f"the GCS at {where} closed the connection during authentication: "
                              "the cluster token is wrong") from None
    except (OSError, TimeoutError) as e:
        raise ConnectionError(f"cannot reach the lumos GCS at {where}: {e or type(e).__name__}") from None


def wait_for_gcs(gcs: tuple[str, int], token: bytes, config: Any, timeout_s: float) -> None:
    """Retry ``gcs_nodes`` until the GCS answers; a wrong token fails at once."""
    deadline = time.monotonic() + timeout_s
    delay = 0.2
    while True:
        try:
            gcs_nodes(gcs, token, config, min(10.0, max(1.0, deadline - time.monotonic())))
            return
        except ConnectionError as e:
            if time.monotonic() + delay > deadline:
                raise NodeStartError(f"{e}; gave up after {timeout_s:.0f}s (--join-timeout-s)") from None
        time.sleep(delay)
        delay = min(delay * 2, 5.0)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lumos.launch.node",
                                description="run one lumos node in the foreground (for Slurm steps and containers)")
    role = p.add_mutually_exclusive_group(required=True)
    role.add_argument("--head", action="store_true", help="start the GCS and this node's raylet")
    role.add_argument("--address", help="HOST:PORT of the head's GCS to join")
    p.add_argument("--token-file", default=None, help="file holding the cluster token (else LUMOS_CLUSTER_TOKEN)")
    p.add_argument("--port", type=int, default=6379, help="GCS port of the head (0: any free)")
    p.add_argument("--node-ip-address", default="auto",
                   help="address this node listens on and advertises (auto: Slurm's NodeAddr in a Slurm "
                        "step, else the address of the route to the GCS)")
    p.add_argument("--num-cpus", type=float, default=None)
    p.add_argument("--num-gpus", type=float, default=None)
    p.add_argument("--memory", type=int, default=None)
    p.add_argument("--resources", default=None, help="custom resources as JSON")
    p.add_argument("--object-store-memory", type=int, default=None, help="store capacity in bytes")
    p.add_argument("--no-dashboard", action="store_true", help="head: start no dashboard")
    p.add_argument("--dashboard-host", default=None, help="head: dashboard address (default: the node's)")
    p.add_argument("--dashboard-port", type=int, default=8265)
    p.add_argument("--client-server-port", type=int, default=10001,
                   help="head: port of the client server that lumos:// drivers connect to (0: any free)")
    p.add_argument("--client-server-host", default=None,
                   help="head: client server address (default: the node's; 0.0.0.0 for `kubectl port-forward`)")
    p.add_argument("--no-client-server", action="store_true", help="head: start no client server")
    p.add_argument("--client-file", default=None,
                   help="head: write the client address (lumos://HOST:PORT) here once it serves")
    p.add_argument("--address-file", default=None, help="head: write HOST:PORT of the GCS here once it serves")
    p.add_argument("--dashboard-file", default=None,
                   help="head: write the dashboard's login link here (0600; the directory must be private)")
    p.add_argument("--join-timeout-s", type=float, default=300.0, help="how long a joining node waits for the GCS")
    p.add_argument("--system-config", default=None, help="JSON overrides of lumos Config fields")
    p.add_argument("--wait-for-nodes", type=int, default=None, metavar="N",
                   help="start nothing: wait until the cluster at --address has N alive nodes "
                        "(for --join-timeout-s), then exit 0")
    return p


def _wait_only(args: argparse.Namespace) -> int:
    from lumos._private.config import Config
    from lumos._private.transport.connection import parse_address
    try:
        gcs = parse_address(args.address or "")
        if not isinstance(gcs, tuple):
            raise ValueError("--wait-for-nodes needs --address HOST:PORT")
        token = read_token(args.token_file, os.environ)
        alive = wait_for_nodes(gcs, token, Config.resolve(), args.wait_for_nodes, args.join_timeout_s)
    except (NodeStartError, ValueError) as e:
        print(f"lumos node: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    print(f"lumos: {alive} node(s) alive at {args.address}", flush=True)
    return 0


def wait_for_nodes(gcs: tuple[str, int], token: bytes, config: Any, n: int, timeout_s: float) -> int:
    """Wait until the cluster has ``n`` ALIVE nodes; returns how many it has.

    Raises:
        NodeStartError: the token is wrong, or ``timeout_s`` passed first.
    """
    deadline = time.monotonic() + timeout_s
    alive = 0
    while True:
        try:
            alive = sum(1 for node in gcs_nodes(gcs, token, config) if node.state == "ALIVE")
        except PermissionError as e:
            raise NodeStartError(str(e)) from None
        except ConnectionError:
            alive = 0
        if alive >= n:
            return alive
        if time.monotonic() > deadline:
            raise NodeStartError(f"{alive} of {n} nodes joined the cluster at {gcs[0]}:{gcs[1]} within "
                                 f"{timeout_s:.0f}s")
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.wait_for_nodes is not None:
        return _wait_only(args)
    try:
        node, record = _start(args)
    except NodeStartError as e:
        print(f"lumos node: error: {e}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    return _run(node, record)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _start(args: argparse.Namespace) -> tuple[Any, dict[str, Any]]:
    from lumos._private.config import Config
    from lumos._private.node import NodeProcesses, default_store_bytes, new_session_dir, node_resources
    from lumos._private.transport.connection import parse_address

    try:
        overrides = json.loads(args.system_config) if args.system_config else {}
        config = Config.resolve(overrides)
        resources = json.loads(args.resources) if args.resources else {}
        res = node_resources(args.num_cpus, args.num_gpus, resources, args.memory)
    except (ValueError, TypeError) as e:
        raise NodeStartError(str(e)) from None
    token = read_token(args.token_file, os.environ)
    gcs: tuple[str, int] | None = None
    if args.address:
        try:
            parsed = parse_address(args.address)
        except ValueError as e:
            raise NodeStartError(str(e)) from None
        if not isinstance(parsed, tuple):
            raise NodeStartError(f"--address must be HOST:PORT of the head's GCS, got {args.address!r}")
        gcs = parsed
        try:
            wait_for_gcs(gcs, token, config, args.join_timeout_s)
        except PermissionError as e:
            raise NodeStartError(str(e)) from None
    ip = args.node_ip_address if args.node_ip_address != "auto" else auto_node_ip(os.environ, gcs)
    res[f"node:{ip}"] = 1.0
    store = args.object_store_memory or config.object_store_memory or default_store_bytes()
    try:
        session_dir = new_session_dir()
    except OSError as e:  # UnsafePathError says what to fix
        raise NodeStartError(str(e)) from None
    node = NodeProcesses(session_dir, config)
    node.write_token(token)
    dashboard = ""
    client = ""
    try:
        if args.head:
            res["node:__internal_head__"] = 1.0
            node.start_gcs_and_raylet(resources=res, store_bytes=store, host=ip, gcs_port=args.port,
                                      private=False, tie_to_parent=True)
            assert node.gcs_address is not None
            address = f"{node.gcs_address[0]}:{node.gcs_address[1]}"
            if not args.no_client_server:
                client = _start_client_server(node, args.client_server_host or ip, args.client_server_port,
                                              address, overrides)
                # Bound to every address: advertise the node's, as for the GCS.
                client = client.replace("lumos://0.0.0.0:", f"lumos://{ip}:")
            if not args.no_dashboard:
                dashboard = _start_dashboard(node, args.dashboard_host or ip, args.dashboard_port)
        else:
            address = args.address
            node.start_raylet(address, resources=res, store_bytes=store, host=ip, tie_to_parent=True)
    except (RuntimeError, TimeoutError, OSError) as e:
        node.stop()
        raise NodeStartError(f"could not start the node: {e}") from None
    except BaseException:
        node.stop()
        raise
    if client and args.client_file:
        _write_atomically(args.client_file, client + "\n")
    if args.head and args.address_file:
        # Last: launchers take the address file as "the head is up", client address included.
        _write_atomically(args.address_file, address + "\n")
    kind = "head node" if args.head else "node"
    print(f"lumos {kind} {node.node_id.hex()[:8]} on {socket.gethostname()} ({ip}): GCS at {address}, "
          f"session directory {session_dir}", flush=True)
    if client:
        print(f"lumos client address: {client} (connect with lumos.init(\"{client}\", _token=TOKEN_FILE))",
              flush=True)
    if dashboard:
        # The login link carries a key derived from the token; job output is often readable by others.
        base = dashboard.split("/login", 1)[0]
        if args.dashboard_file:
            from lumos._private.process import write_private_file
            write_private_file(args.dashboard_file, (dashboard + "\n").encode())
            print(f"lumos dashboard: {base} (login link in {args.dashboard_file})", flush=True)
        else:
            print(f"lumos dashboard: {base} (`lumos kubernetes login-url --token-file TOKEN_FILE --url {base}` "
                  "prints its login link)", flush=True)
    return node, {"address": address, "session_dir": session_dir, "client_address": client}


def _start_client_server(node: Any, host: str, port: int, address: str, overrides: dict[str, Any]) -> str:
    """Start the head's client server; returns ``lumos://HOST:PORT``, or "" on failure (the cluster
    works without it, for drivers on its nodes)."""
    from lumos._private.client.launch import start_client_server
    try:
        return start_client_server(node, host, port, address, overrides, tie_to_parent=True)
    except (RuntimeError, TimeoutError) as e:
        print(f"lumos node: warning: no client server (lumos:// drivers cannot connect): {e}", file=sys.stderr,
              flush=True)
        return ""


def _start_dashboard(node: Any, host: str, port: int) -> str:
    """Start the head's dashboard; returns its login link, or "" on failure."""
    from lumos._private.dashboard_process import DashboardStartError, start_dashboard
    try:
        proc, url = start_dashboard(node.session_dir, f"unix:{node.gcs_unix}", node.token_path, host, port,
                                    private=True)
    except (DashboardStartError, ValueError, OSError) as e:
        print(f"lumos node: warning: the cluster runs without its dashboard: {e}", file=sys.stderr, flush=True)
        return ""
    node.procs.append(proc)
    return str(url)


def _run(node: Any, record: dict[str, Any]) -> int:
    stopping = []

    def on_signal(signum: int, frame: Any) -> None:
        stopping.append(signum)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, on_signal)
    dead: list[str] = []
    while not stopping:
        dead = [" ".join(p.args[2:3]) or str(p.pid) for p in node.procs if p.poll() is not None]
        if dead:
            break
        time.sleep(0.2)
    if dead:
        print(f"lumos node: {', '.join(dead)} exited; stopping the node (logs in {record['session_dir']}/logs)",
              file=sys.stderr, flush=True)
    node.stop()
    print(f"lumos node: stopped ({'signal ' + signal.Signals(stopping[0]).name if stopping else 'a process died'})",
          flush=True)
    return 0 if stopping else EXIT_CHILD_DIED


if __name__ == "__main__":
    sys.exit(main())
