"""The fork server: a pre-imported template worker that forks new workers (issue 19).

One per raylet, started by its worker pool (``raylet/worker_pool.py``) when
``worker_start="fork"``. It imports once what every worker needs (lumos's core worker
and executor, cloudpickle; numpy and psutil when installed, once it is idle), runs a
worker's start-up code once when idle (``worker.main.rehearse``: children then find
that code specialized and its caches filled, pages they would each have copied), freezes
those objects out of the garbage collector's sight (so children do not copy their pages
by touching them), and waits on its control pipe. Each request forks a worker,
copy-on-write: about a millisecond instead of an interpreter start and its imports
(~300 ms of CPU), and the child's private memory is only what it writes.

```
raylet ─ stdin:  {"worker_id": hex, "log": path}\\n ──► fork server (one thread, no sockets)
       ◄ stdout: {"worker_id": hex, "pid": N}\\n ─────   │ clone(CLONE_PARENT)
                                                        ▼
                              B: the worker, a child of the raylet from its first instruction
```
A request may also carry ``"gcs_durable": bool`` (the GCS's answer, once the raylet
has it), which the child passes to its core worker instead of asking the GCS itself.
The raylet must learn each worker's exit status, and only a parent can wait for a
process. ``clone(CLONE_PARENT)`` (``CloneParent``) makes B the raylet's child directly:
one copy of the template's page tables per worker. Where that is not available (another
architecture or C library), the server double-forks: A forks B and exits, and with
``PR_SET_CHILD_SUBREAPER`` on the raylet the orphaned B becomes the raylet's child (the
server waits for A before it answers, so B is the raylet's by the time the raylet hears
of it); that costs a second fork and A's exit, ~2.5 ms of CPU per worker. B then sets
its parent-death signal against the raylet, as a spawned worker does, so the fork
server can die (and be restarted) without taking its workers along.

In the child: fds 0/1/2 become /dev/null and the worker's log file, every other
inherited fd is closed, numpy's global random state is re-seeded (``random`` re-seeds
itself at fork), the collector is enabled again, and ``/proc/<pid>/cmdline`` is
rewritten to the worker's (``ps`` and tools that look for ``--worker-id`` see a worker).
The server forks only while it is single-threaded; a request it cannot serve is
answered with an error and the raylet spawns that worker instead.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import select
import signal
import sys
import threading
import time
import traceback
from typing import Any

logger = logging.getLogger(__name__)

#: Longest a forked worker waits to be reparented to the raylet before it gives up.
_REPARENT_TIMEOUT_S = 10.0
#: Largest request line the server accepts (a worker id and a log path).
_MAX_REQUEST_BYTES = 64 * 1024


#: Modules a worker may well use, imported once the server has been idle a moment (see
#: ``serve``): workers forked later share them, and the first workers of a new cluster
#: are not held up by them. ``worker_warm_modules`` adds the user's (torch, say).
OPTIONAL_MODULES = ("numpy", "numpy.random", "psutil")
#: Quiet time on the control pipe after which the server imports the next optional module.
WARM_AFTER_IDLE_S = 0.2
#: Forks after which the server warms up (all of it, at once) even without such a quiet
#: time: a burst of actors right after ``init`` keeps the pipe busy, and every worker
#: forked before the warm-up imports numpy itself (~90 ms of CPU each here).
WARM_AFTER_FORKS = 2


def preimport() -> None:
    """Import what every worker imports, so children share those pages."""
    import asyncio  # noqa: F401
    import concurrent.futures  # noqa: F401
    import cloudpickle  # noqa: F401
    import lumos  # noqa: F401
    import lumos._private.worker.main  # noqa: F401
    import lumos._private.worker_context  # noqa: F401
    import lumos._private.core_worker.actor_host  # noqa: F401
    import lumos._private.core_worker.actor_submitter  # noqa: F401
    import encodings.idna  # noqa: F401  (socket addresses given as str)
    import lumos.actor  # noqa: F401
    import lumos.remote_function  # noqa: F401


def serve(raylet_pid: int, worker_args: list[str], rfd: int = 0, wfd: int = 1) -> None:
    """Answer fork requests read from ``rfd`` until it closes (the raylet went away).

    Ready (``{"ready": pid}``) as soon as what every worker needs is imported: a new
    cluster's first workers are forked while the GCS and raylet still start on the same
    cores (importing numpy first added ~0.1 s to ``init`` + the first task). The
    optional modules follow one at a time whenever the pipe has been quiet for
    ``WARM_AFTER_IDLE_S``, and all at once after ``WARM_AFTER_FORKS`` forks (a burst
    right after ``init`` leaves no quiet time) (``{"warmed": [modules]}`` once done); a
    worker forked before imports them itself if it needs them."""
    preimport()
    from lumos._private.config import Config, preload_modules
    from lumos._private.worker import main as worker_main
    # Parsed once here; each child fills in its worker id.
    args = worker_main.parse_args([*worker_args, "--worker-id", ""])
    config = Config.from_json(args.config) if args.config else Config.resolve()
    template = (args, config)
    # The user's modules before the first fork: every worker would import them itself,
    # the first ones too (a cluster's first task waits for them either way).
    preloaded, failed = worker_main.preload(config.worker_preload_modules)
    if preloaded:
        _stop_native_threads()
    global _CLONE
    _CLONE = CloneParent.probe() if os.getppid() == raylet_pid and config.worker_fork_clone else None
    gc.collect()
    gc.freeze()
    gc.disable()
    _write(wfd, {"ready": os.getpid(), "clone": _CLONE is not None, "preloaded": preloaded, "failed": failed})
    # The user's warm modules (``worker_warm_modules``) come last and only in quiet time:
    # a burst of plain tasks right after ``init`` never waits for torch's import.
    warm = [] if config.worker_warm_modules == "auto" else preload_modules(config.worker_warm_modules)
    optional: list[str | None] = [*OPTIONAL_MODULES, None, *warm]  # None: the rehearsal
    forked = 0
    present: list[str] = []
    buf = b""
    skipping = False  # inside a line too long to be a request, dropped up to its newline
    while True:
        pending = b"\n" in buf  # (a request read with others, not served yet)
        if optional and (forked >= WARM_AFTER_FORKS and len(optional) > len(warm)
                         or not pending and not select.select([rfd], [], [], WARM_AFTER_IDLE_S)[0]):
            name = optional.pop(0)
            if len(optional) < len(warm):
                warm.pop(0)
            if name is None:
                _rehearse(args, config)
            else:
                try:
                    __import__(name)
                    present.append(name)
                except ImportError:
                    pass
            _stop_native_threads()  # numpy's BLAS pool: before the next fork
            if not optional:
                _write(wfd, {"warmed": present})
            gc.collect()
            gc.freeze()  # the new objects, out of the children's collections
            continue
        if pending:
            line, buf = buf.split(b"\n", 1)
            _write(wfd, _serve_one(line, raylet_pid, template))
            forked += 1
            continue
        try:
            chunk = os.read(rfd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return
        if skipping:
            end = chunk.find(b"\n")
            if end < 0:
                continue
            chunk, skipping = chunk[end + 1:], False
        buf += chunk
        whole = buf.rfind(b"\n") + 1  # (the requests complete so far are served first)
        if len(buf) - whole > _MAX_REQUEST_BYTES:
            logger.error("fork request longer than %d bytes; dropped", _MAX_REQUEST_BYTES)
            buf, skipping = buf[:whole], True


def _rehearse(args: Any, config: Any) -> None:
    """``worker.main.rehearse``: a worker's start-up run once here, so that children
    find its code specialized and its caches filled (here: ~1.2 ms less CPU and ~0.3 MiB
    less private memory per worker). Its failure costs only that."""
    from lumos._private.worker import main as worker_main
    try:
        worker_main.rehearse(args, config)
    except Exception as e:
        logger.warning("the fork server's rehearsal of a worker's start failed (workers start anyway): %s", e)


def _stop_native_threads() -> None:
    """numpy's OpenBLAS starts a thread pool at import and stops it in its pre-fork
    handler (children start their own on first use): one throw-away fork stops it here,
    so the template is single-threaded from its first real fork on."""
    if len(os.listdir("/proc/self/task")) == 1:
        return
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        logger.warning("the fork server still runs %d threads after its imports; forking anyway "
                       "(native pools with pre-fork handlers, as OpenBLAS's, are safe)", threads)


#: How this server forks workers (None: the double fork); set by ``serve``.
_CLONE: "CloneParent | None" = None


def _serve_one(line: bytes, raylet_pid: int, template: tuple[Any, Any]) -> dict[str, Any]:
    try:
        req = json.loads(line)
        worker_id, log_path = str(req["worker_id"]), str(req["log"])
        bytes.fromhex(worker_id)
        durable = req.get("gcs_durable")
        if durable is not None and not isinstance(durable, bool):
            raise ValueError(f"gcs_durable must be true or false, not {durable!r}")
    except (ValueError, KeyError, TypeError) as e:
        logger.error("malformed fork request %r: %s", line[:200], e)
        return {"worker_id": "", "error": f"malformed request: {e}"}
    # A thread holding a lock at fork leaves that lock held for ever in the child.
    if threading.active_count() != 1:
        return {"worker_id": worker_id, "error": f"{threading.active_count()} threads in the fork server"}
    try:
        pid = _fork_worker(worker_id, log_path, raylet_pid, template, _CLONE, durable)
    except OSError as e:
        logger.error("fork of worker %s failed: %s", worker_id[:12], e)
        return {"worker_id": worker_id, "error": f"fork failed: {e}"}
    return {"worker_id": worker_id, "pid": pid}


class CloneParent:
    """``os.fork()`` whose child is this process's parent's child: ``clone(CLONE_PARENT)``
    through ``syscall(2)``, wrapped in the interpreter's fork hooks as ``os.fork`` wraps
    ``fork(3)``. The C library's own fork bookkeeping that matters to a single-threaded
    caller is the thread id cached in its thread descriptor, which the kernel writes
    (``CLONE_CHILD_SETTID``) at the offset found by ``probe``; the rest (lock resets, the
    stacks of other threads) has nothing to do in a process with one thread that holds
    no lock. Linux on x86-64 and arm64 with glibc only: ``probe`` returns None elsewhere."""

    _CLONE_PARENT = 0x00008000
    _CLONE_CHILD_CLEARTID = 0x00200000
    _CLONE_CHILD_SETTID = 0x01000000
    #: (syscall number, whether the child-tid pointer comes before tls) per machine.
    _SYSCALLS = {"x86_64": (56, True), "aarch64": (220, False)}

    def __init__(self, nr: int, ctid_first: bool, tid_addr: int) -> None:
        import ctypes
        self._nr = nr
        self._ctid_first = ctid_first
        self._tid_addr = tid_addr
        # PyDLL: the GIL stays held across the call (as os.fork holds it across fork()).
        self._syscall = ctypes.PyDLL(None, use_errno=True).syscall
        self._syscall.restype = ctypes.c_long
        self._syscall.argtypes = [ctypes.c_long, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_void_p]
        api = ctypes.pythonapi
        self._before, self._after_parent, self._after_child = (
            api.PyOS_BeforeFork, api.PyOS_AfterFork_Parent, api.PyOS_AfterFork_Child)
        for f in (self._before, self._after_parent, self._after_child):
            f.argtypes, f.restype = [], None
        self._get_errno = ctypes.get_errno

    @classmethod
    def probe(cls) -> "CloneParent | None":
        """A ``CloneParent`` for this process, or None where it cannot be used safely."""
        machine = os.uname().machine
        if not sys.platform.startswith("linux") or machine not in cls._SYSCALLS or \
                os.confstr("CS_GNU_LIBC_VERSION") is None:
            return None
        import ctypes
        try:
            libc = ctypes.CDLL(None)
            libc.pthread_self.restype = ctypes.c_void_p
            self_addr = libc.pthread_self()
        except (OSError, AttributeError):
            return None
        if not self_addr or threading.get_native_id() != os.getpid():
            return None
        # glibc keeps the thread's kernel id in its descriptor (``struct pthread``): the
        # one int there equal to our tid (the pid, in the main thread) is it.
        words = (ctypes.c_int32 * 1024).from_address(self_addr)
        hits = [i for i in range(1024) if words[i] == os.getpid()]
        if len(hits) != 1:
            return None
        nr, ctid_first = cls._SYSCALLS[machine]
        try:
            return cls(nr, ctid_first, self_addr + 4 * hits[0])
        except AttributeError:  # an interpreter without the fork hooks exported
            return None

    def fork(self) -> int:
        """Like ``os.fork()``; the child's parent is this process's parent."""
        flags = self._CLONE_PARENT | self._CLONE_CHILD_SETTID | self._CLONE_CHILD_CLEARTID | signal.SIGCHLD
        ctid, tls = self._tid_addr, None
        self._before()
        if self._ctid_first:  # x86-64: clone(flags, stack, ptid, ctid, tls)
            pid = self._syscall(self._nr, flags, None, None, ctid, tls)
        else:  # arm64: clone(flags, stack, ptid, tls, ctid)
            pid = self._syscall(self._nr, flags, None, None, tls, ctid)
        if pid == 0:
            self._after_child()
            return 0
        err = self._get_errno()
        self._after_parent()
        if pid < 0:
            raise OSError(err, f"clone(CLONE_PARENT) failed: {os.strerror(err)}")
        return int(pid)


def _fork_worker(worker_id: str, log_path: str, raylet_pid: int, template: tuple[Any, Any],
                 clone: CloneParent | None = None, gcs_durable: bool | None = None) -> int:
    """The worker B's pid: cloned as the raylet's child, or (no ``clone``) forked by A,
    which exits, once A has been reaped."""
    # A raw clone runs no pthread_atfork handlers: only a process with one native thread
    # is cloned (see _stop_native_threads).
    if clone is not None and len(os.listdir("/proc/self/task")) == 1:
        try:
            pid = clone.fork()
        except OSError as e:  # e.g. a seccomp filter that refuses CLONE_PARENT
            global _CLONE
            _CLONE = None
            logger.warning("%s; double-forking workers from now on", e)
        else:
            if pid == 0:
                _run_child(worker_id, log_path, raylet_pid, template, gcs_durable)  # never returns
            return pid
    r, w = os.pipe()
    try:
        a = os.fork()
        if a == 0:  # A
            try:
                os.close(r)
                b = os.fork()
                if b == 0:
                    os.close(w)
                    _run_child(worker_id, log_path, raylet_pid, template, gcs_durable)  # never returns
                os.write(w, str(b).encode())
            finally:
                os._exit(0)
        os.close(w)
        w = -1
        data = b""
        while True:
            chunk = os.read(r, 64)
            if not chunk:
                break
            data += chunk
        os.waitpid(a, 0)  # B is the raylet's child from here on
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)
    if not data:
        raise OSError(f"the intermediate process {a} exited without forking the worker")
    return int(data)


def _own_process_group() -> None:
    """A worker leads its own process group: what its tasks start (``subprocess.Popen``)
    is in it, and ends with the worker (``WorkerPool.reap_orphans``), as in Ray."""
    try:
        os.setpgid(0, 0)
    except OSError:
        pass


def _run_child(worker_id: str, log_path: str, raylet_pid: int, template: tuple[Any, Any],
               gcs_durable: bool | None = None) -> None:
    code = 1
    try:
        _own_process_group()
        first_parent = os.getppid()
        deadline = time.monotonic() + _REPARENT_TIMEOUT_S
        while os.getppid() != raylet_pid:
            if os.getppid() != first_parent or time.monotonic() > deadline:
                os._exit(1)  # the raylet is gone (we went to init or another reaper)
            time.sleep(0.0005)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.closerange(3, _max_fd())
        if "numpy.random" in sys.modules:
            _reseed_numpy(sys.modules["numpy.random"])  # ``random`` re-seeds itself at fork
        gc.enable()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        args, config = template
        args.worker_id = worker_id
        if gcs_durable is not None:
            args.gcs_durable = "1" if gcs_durable else "0"
        sys.argv = [sys.executable, "-m", "lumos._private.worker.main", "--worker-id", worker_id]
        set_cmdline(" ".join(sys.argv))
        from lumos._private.worker import main as worker_main
        worker_main.run(args, config)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        try:
            os.write(2, traceback.format_exc().encode())
        finally:
            os._exit(1)
    os._exit(code)


def _reseed_numpy(nprandom: Any) -> None:
    """A fresh key for numpy's global RandomState, straight from the OS: a key of 624
    random words is a full MT19937 state (what ``seed()`` derives through a SeedSequence,
    at four times the cost in a new child)."""
    import numpy
    try:
        nprandom.mtrand._rand._bit_generator.state = {
            "bit_generator": "MT19937",
            "state": {"key": numpy.frombuffer(os.urandom(624 * 4), dtype=numpy.uint32), "pos": 624}}
    except (AttributeError, TypeError, ValueError):  # another numpy's layout
        nprandom.seed()


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def set_cmdline(text: str) -> bool:
    """Show ``text`` as this process's command line in ``/proc/<pid>/cmdline`` (Linux):
    written over the original argument strings, as ``setproctitle`` does. Fields are
    separated by spaces; the text is cut to the original arguments' length."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    except (OSError, ValueError, IndexError):
        return False
    size = end - start
    if size < 8:
        return False
    import ctypes
    data = text.encode()[:size - 2]
    # A non-NUL last byte tells the kernel the area was rewritten: it reads up to the first NUL.
    area = data + b"\0" * (size - len(data) - 1) + b" "
    ctypes.memmove(start, area, size)
    return True


def _write(fd: int, msg: dict[str, Any]) -> None:
    data = (json.dumps(msg) + "\n").encode()
    while data:
        n = os.write(fd, data)
        data = data[n:]


def main() -> None:
    """``python -m lumos._private.worker.fork_server RAYLET_PID -- WORKER ARGS...``"""
    from lumos._private import thread_limits
    from lumos._private.process import die_with_parent, lumos_logger_only, restore_user_env
    if len(sys.argv) < 3 or sys.argv[2] != "--":
        raise SystemExit("usage: python -m lumos._private.worker.fork_server RAYLET_PID -- WORKER_ARGS...")
    raylet_pid = int(sys.argv[1])
    die_with_parent(raylet_pid, signal.SIGKILL)
    restore_user_env()  # the workers it forks inherit the user's environment
    thread_limits.default_for_worker()  # before numpy loads: one BLAS thread unless the user set more
    # Ctrl-C in a terminal reaches the raylet's whole group; the raylet stops us itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # (lumos's records only: the root logger stays as Python leaves it for the user's code)
    lumos_logger_only(sys.stderr)
    serve(raylet_pid, sys.argv[3:])


if __name__ == "__main__":
    main()
