"""A worker process: started by its raylet, runs tasks (or hosts one actor).

``python -m lumos._private.worker.main --raylet-socket ... --worker-id ...``, or forked
from the raylet's fork server (``fork_server.py``), which parses the same arguments
once and calls ``run(args)`` in each child.

The main thread runs the ``Executor`` loop; the ``lumos-io`` thread runs the core
worker. The process exits when its raylet goes away (connection loss, or the kernel's
parent-death signal).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from lumos._private import thread_limits
from lumos._private.config import Config, preload_modules
from lumos._private.core_worker.core_worker import WORKER, CoreWorker
from lumos._private.core_worker.executor import Executor, TaskOutput
from lumos._private.process import (die_with_parent, lumos_logger_only, read_token, restore_user_env, setup_logging,
                                    tune_malloc)
from lumos._private.transport.connection import parse_address

logger = logging.getLogger(__name__)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="lumos-worker")
    p.add_argument("--raylet-socket", required=True)
    p.add_argument("--gcs-address", required=True)
    p.add_argument("--token-file", required=True)
    p.add_argument("--session-dir", required=True)
    p.add_argument("--node-id", required=True)
    p.add_argument("--worker-id", required=True)
    p.add_argument("--store-dir", required=True)
    p.add_argument("--node-ip", default="127.0.0.1")
    p.add_argument("--config", default="")
    p.add_argument("--parent-pid", type=int, default=0)
    # Whether the GCS keeps its tables in durable storage, as the raylet heard it from the
    # GCS; without it the worker asks the GCS (one more request at start-up).
    p.add_argument("--gcs-durable", choices=["", "0", "1"], default="")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


def run(args: argparse.Namespace, config: Config | None = None) -> None:
    """The worker's life, from parsed arguments (the fork server parses them, and the
    config, once in its template: ~2 ms less per forked worker)."""
    if args.parent_pid:
        die_with_parent(args.parent_pid)
    restore_user_env()  # (a forked worker's template did it already)
    thread_limits.default_for_worker()  # before numpy loads: one BLAS thread unless the user set more
    lumos_logger_only()
    setup_logging(os.path.join(args.session_dir, "logs"), f"worker-{args.worker_id[:12]}", logger_name="lumos")
    signal.signal(signal.SIGINT, signal.default_int_handler)  # cancel() interrupts user code
    if config is None:
        config = Config.from_json(args.config) if args.config else Config.resolve()
    tune_malloc(config.worker_malloc_mmap_threshold_bytes, config.worker_malloc_trim_threshold_bytes)
    cw = CoreWorker(mode=WORKER, config=config, token=read_token(args.token_file),
                    gcs_address=parse_address(args.gcs_address), raylet_socket=args.raylet_socket,
                    session_dir=args.session_dir, node_id=bytes.fromhex(args.node_id),
                    store_dir=args.store_dir, worker_id=bytes.fromhex(args.worker_id),
                    node_ip=args.node_ip, gcs_durable=None if not args.gcs_durable else args.gcs_durable == "1")
    executor = Executor(cw)
    cw.executor = executor
    sys.stdout = TaskOutput(executor, False, sys.__stdout__)
    sys.stderr = TaskOutput(executor, True, sys.__stderr__)
    try:
        cw.start()
    except Exception as e:
        logger.error("worker could not connect: %s", e)
        os._exit(1)
    executor.open_child_output()
    import lumos._private.worker_context as ctx
    ctx.set_worker_mode(cw)
    for failure in preload(config.worker_preload_modules)[1]:
        logger.warning("could not import %s (worker_preload_modules)", failure)
    try:
        executor.run()
        executor.drain_owned()
    finally:
        cw.shutdown()
        os._exit(0)


def preload(names: str) -> tuple[list[str], list[str]]:
    """Import the ``worker_preload_modules`` this process does not have yet (the fork
    server before its first fork; a worker that was spawned, or whose fork server could
    not import one). Returns the modules imported and, for each that failed, "name
    (Error: text)"."""
    imported: list[str] = []
    failed: list[str] = []
    for name in preload_modules(names):
        if name in sys.modules:
            continue
        try:
            __import__(name)
            imported.append(name)
        except Exception as e:  # (a user's module may raise anything as it loads)
            failed.append(f"{name} ({type(e).__name__}: {e})")
    return imported, failed


def rehearse(args: argparse.Namespace, config: Config) -> None:
    """Run once, in the fork server before it forks workers, the code each worker runs as
    it starts: build a core worker and its executor, serve and call a connection over a
    Unix socket, start a thread, and take it all down again.

    A forked worker is charged a page copy for every page of the template it writes, and
    code the template never ran writes a good many: the interpreter specializes each
    function the first times it runs (rewriting its code object's bytecode), fills
    type and attribute caches and sets up modules' lazy state. Run once here, a child
    finds that work done. Nothing of it is left: the objects are dropped, the socket's
    directory removed, the thread joined (the server forks only while single-threaded)."""
    import asyncio
    import shutil
    import tempfile
    from lumos._private.protocol import messages as m
    from lumos._private.transport.connection import RpcServer, connect
    tmp = tempfile.mkdtemp(prefix="rehearsal-", dir=args.session_dir)
    token = os.urandom(32)
    cw = CoreWorker(mode=WORKER, config=config, token=token, gcs_address=("127.0.0.1", 0),
                    raylet_socket=os.path.join(tmp, "none.sock"), session_dir=tmp, node_id=os.urandom(16),
                    store_dir=tmp, worker_id=os.urandom(16), node_ip="127.0.0.1", gcs_durable=False)
    executor = Executor(cw)
    try:
        async def boot() -> None:
            server = RpcServer(token=token, config=config, name="rehearsal",
                               handlers={m.GetCoreWorkerStats: lambda conn, msg: {"rehearsal": True}})
            await server.start(unix_path=os.path.join(tmp, "r.sock"), host="127.0.0.1", port=0)
            try:
                conn = await connect(os.path.join(tmp, "r.sock"), token=token, config=config, name="rehearsal")
                try:
                    await conn.call(m.GetCoreWorkerStats(), 5.0)
                finally:
                    conn.close()
            finally:
                await asyncio.wait_for(server.stop(), 2.0)

        # (asyncio's own loop: a first uvloop loop sets up libuv's process-wide state, a
        # signal pipe among it, which children close with the other inherited fds and
        # would then take for set up; each worker's first loop sets it up for itself.)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(boot())
        finally:
            loop.close()
        # The messages a worker's start-up and first task send and read, through their codecs.
        address = m.Address(cw.node_id, cw.worker_id, os.path.join(tmp, "w.sock"), "127.0.0.1", 1)
        for msg in (m.RegisterClient(cw.worker_id, os.getpid(), address, False, None),
                    m.Subscribe("nodes", None), m.KvGet("job", b"j", 5.0),
                    m.TaskReply(b"t" * 24, [], False, False, [], cw.worker_id, 0.0, 0.0)):
            m.decode(m.encode(m.NOTIFY, 0, msg))
        thread = threading.Thread(target=lambda: None, name="lumos-io")
        thread.start()
        thread.join()
    finally:
        executor.close_wake_pipe()
        cw.store.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
