"""Entry point of the head node's dashboard process: ``python -m lumos.dashboard``.

Binds its port at once and reports ``{"url", "port", "pid"}`` on the ready pipe (so
``lumos.init()`` is not held up), but imports Bokeh and connects to the GCS only when
the first browser connects: an unopened dashboard costs one idle process.
Started by the head node (``lumos.init()``, ``lumos start --head``), which hands it the
session directory, the GCS address and the token file; it uses lumos's public
surfaces only (``lumos.state``, ``lumos.util.session``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket

from lumos.util.session import die_with_parent, read_token, report_ready, setup_logging, write_private_file

logger = logging.getLogger("lumos.dashboard")


def bind(host: str, port: int, search: int) -> tuple[socket.socket, int]:
    """Listen on ``host:port``, or the next free port up to ``port + search``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    last: OSError | None = None
    for candidate in ([port] if port == 0 else range(port, port + search + 1)):
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, candidate))
        except OSError as e:
            sock.close()
            last = e
            continue
        sock.listen(128)
        sock.setblocking(False)
        return sock, sock.getsockname()[1]
    raise OSError(f"no free port for the dashboard in {port}..{port + search} on {host}: {last}")


def public_host(host: str) -> str:
    if host in ("", "0.0.0.0", "::"):
        return socket.gethostname()
    return f"[{host}]" if ":" in host else host


async def serve(args: argparse.Namespace, sock: socket.socket, port: int, token: bytes) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    first = asyncio.Event()
    loop.add_reader(sock.fileno(), first.set)
    waiter = asyncio.ensure_future(first.wait())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
    loop.remove_reader(sock.fileno())
    if stop.is_set():
        waiter.cancel()
        return
    # Someone connected: now pay for Bokeh and the GCS connection.
    from lumos.dashboard.app import DashboardServer
    from lumos.dashboard.source import ClusterSource
    from lumos.state import StateClient
    client = StateClient(args.gcs_address, token, name="dashboard->gcs")
    source = ClusterSource(client, label=os.path.basename(args.session_dir.rstrip("/")) or args.gcs_address)
    server = DashboardServer(source, token, [sock], port)
    server.start()
    logger.info("dashboard serving on port %d", port)
    await stopper
    server.stop()


def main() -> None:
    p = argparse.ArgumentParser(prog="lumos-dashboard")
    p.add_argument("--session-dir", required=True)
    p.add_argument("--gcs-address", required=True, help="unix:/path/gcs.sock or HOST:PORT")
    p.add_argument("--token-file", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8265)
    p.add_argument("--port-search", type=int, default=100, help="try up to this many ports above --port")
    p.add_argument("--ready-fd", type=int, default=-1)
    p.add_argument("--die-with-parent", type=int, default=0)
    args = p.parse_args()
    if args.die_with_parent:
        die_with_parent(args.die_with_parent)
    setup_logging(os.path.join(args.session_dir, "logs"), "dashboard")
    token = read_token(args.token_file)
    sock, port = bind(args.host, args.port, args.port_search)
    from lumos.dashboard.auth import login_token
    url = f"http://{public_host(args.host)}:{port}/login?token={login_token(token)}"
    info = {"url": url, "port": port, "host": args.host, "pid": os.getpid()}
    write_private_file(os.path.join(args.session_dir, "dashboard.json"), json.dumps(info).encode())
    report_ready(args.ready_fd, info)
    asyncio.run(serve(args, sock, port, token))


if __name__ == "__main__":
    main()
