"""Run every demo notebook through a real jupyter-server, as Binder would.

Runs with the Python of an environment built from ``binder/`` only (so it imports
nothing that environment lacks: no pytest, no lumos test helpers):

    python binder_runner.py NOTEBOOK_DIR SIZES_JSON

1. starts ``bash binder/start jupyter server`` (the command Binder's entry point wraps)
   on 127.0.0.1 with a token and a Hub-like ``base_url``, from the copy of the repository
   it runs in, with the extensions its config enables (postBuild enabled lumos's);
2. checks the lumos dashboard extension answers under ``{base_url}lumos/`` (and again
   while the quickstart's cluster runs: a signed redirect to the live dashboard);
3. for each notebook: opens a session through the REST API (the server starts the
   kernel), runs the code cells over the kernel's websocket channel, and fails on any
   error output not tagged ``raises-exception``;
4. prints one JSON line per notebook (name, seconds, cells) and stops the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import nbformat
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

BASE = "/user/binder/"
CELL_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(url: str, token: str, method: str = "GET", body: Any = None, follow: bool = True) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    opener = urllib.request.build_opener() if follow else urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if text.startswith(("{", "[")) else text)
    except urllib.error.HTTPError as e:  # a redirect not followed: its Location; else the body
        return e.code, e.headers.get("Location") or e.read().decode(errors="replace")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any) -> None:
        return None


async def run_cells(ws_url: str, token: str, nb: Any, after_cell: Any) -> int:
    """Execute the notebook's code cells in order on the kernel behind ``ws_url``."""
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    session = uuid.uuid4().hex
    ran = 0
    try:
        for cell in nb.cells:
            if cell.cell_type != "code":
                continue
            msg_id = uuid.uuid4().hex
            await conn.write_message(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
                           "username": "binder", "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": cell.source, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
            errors: list[str] = []
            deadline = time.monotonic() + CELL_TIMEOUT_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"cell did not finish within {CELL_TIMEOUT_S} s:\n{cell.source}")
                raw = await asyncio.wait_for(conn.read_message(), left)
                if raw is None:
                    raise ConnectionError("the kernel's websocket closed")
                if isinstance(raw, bytes):
                    continue  # binary frames carry widget buffers
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind = msg["msg_type"]
                if kind == "error":
                    errors.append(f"{msg['content']['ename']}: {msg['content']['evalue']}")
                if kind == "status" and msg["content"]["execution_state"] == "idle":
                    break
            if errors and "raises-exception" not in cell.metadata.get("tags", []):
                raise RuntimeError(f"cell failed: {errors}\n{cell.source}")
            after_cell(cell)
            ran += 1
    finally:
        conn.close()
    return ran


def main() -> int:
    nb_dir, sizes = sys.argv[1], json.loads(open(sys.argv[2]).read())
    port, token = free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_TOKEN=token)
    cmd = ["bash", "binder/start", sys.executable, "-m", "jupyter_server", "--no-browser", "--ip=127.0.0.1",
           f"--port={port}", f"--ServerApp.base_url={BASE}", f"--IdentityProvider.token={token}",
           f"--ServerApp.root_dir={nb_dir}"]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open("server.log", "wb"),
                              start_new_session=True)
    root = f"http://127.0.0.1:{port}{BASE}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if http(root + "api/status", token)[0] == 200:
                    break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"jupyter server did not start; see {os.path.abspath('server.log')}")
            time.sleep(0.3)
        # The extension serves BokehJS under its prefix (the launcher needs a running cluster:
        # checked after the quickstart's init cell below).
        status, answer = http(root + "lumos/bokeh/static/js/bokeh.min.js", token)
        if status != 200 or "Bokeh" not in answer[:5000]:
            raise RuntimeError(f"the lumos dashboard extension is not enabled: {status} {answer[:300]!r}")
        print(json.dumps({"extension": "lumos dashboard served under " + BASE + "lumos/"}), flush=True)
        live: list[str] = []

        def after_cell(cell: Any) -> None:
            if cell.source.startswith("import lumos\n%load_ext lumos\n%lumos init"):
                status, answer = http(root + "lumos/dashboard", token, follow=False)
                if status != 302 or "bokeh-session-id=" not in answer:
                    raise RuntimeError(f"no live dashboard for the notebook's cluster: {status} {answer[:300]!r}")
                live.append(answer)

        for name in sorted(n for n in os.listdir(nb_dir) if n.endswith(".ipynb")):
            nb = nbformat.read(os.path.join(nb_dir, name), as_version=4)
            if name in sizes:
                cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
                cell.source += "\n" + sizes[name]
            t = time.monotonic()
            _, sess = http(root + "api/sessions", token, "POST",
                           {"path": name, "type": "notebook", "name": name, "kernel": {"name": "python3"}})
            kernel_id = sess["kernel"]["id"]
            ws = f"ws://127.0.0.1:{port}{BASE}api/kernels/{kernel_id}/channels?session_id={uuid.uuid4().hex}"
            try:
                cells = asyncio.run(run_cells(ws, token, nb, after_cell))
            finally:
                http(root + f"api/sessions/{sess['id']}", token, "DELETE")
            print(json.dumps({"notebook": name, "seconds": round(time.monotonic() - t, 1), "cells": cells}),
                  flush=True)
        print(json.dumps({"live_dashboard_redirects": len(live)}), flush=True)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(5)
    return 0


if __name__ == "__main__":
    sys.exit(main())
