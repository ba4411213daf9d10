"""Starting a head's client server: shared by ``lumos start --head`` and ``python -m lumos.launch.node``."""

from __future__ import annotations

import json
from typing import Any

#: The client server's port when none is given (Ray Client's, so firewalls and docs carry over).
DEFAULT_CLIENT_PORT = 10001


def start_client_server(node: Any, host: str, port: int, gcs_public_address: str,
                        overrides: dict[str, Any] | None, *, tie_to_parent: bool, timeout_s: float = 30.0) -> str:
    """Start the client server next to ``node``'s GCS; returns ``lumos://HOST:PORT``.

    The process joins ``node.procs``, so whoever stops the node stops it too; on failure it is
    ended and left out of them.

    Raises:
        RuntimeError: it exited during start-up (the port is taken, say); its log says why.
        TimeoutError: it did not report ready within ``timeout_s``.
    """
    from lumos._private.gcs.storage import redact_url
    config = dict(overrides or {})
    if config.get("gcs_storage"):  # every local user can read a command line: no Redis password on it
        config["gcs_storage"] = redact_url(str(config["gcs_storage"]))
    proc, fd = node._spawn(["lumos._private.client.server", "--host", host, "--port", str(port),
                            "--gcs-address", f"unix:{node.gcs_unix}", "--gcs-public-address", gcs_public_address,
                            "--token-file", node.token_path, "--session-dir", node.session_dir,
                            "--config", json.dumps(config)], tie_to_parent=tie_to_parent)
    try:
        info = node._await_ready(proc, fd, "client_server", timeout_s)
    except BaseException:
        # A node whose client server failed runs on without it: it must not count as a child that died.
        node.procs.remove(proc)
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        raise
    return f"lumos://{info['host']}:{info['port']}"
