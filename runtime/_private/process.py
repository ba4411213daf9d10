"""Helpers for lumos's own processes (GCS, raylet, workers): start-up and logging.

Each process entry point calls ``setup_logging`` once (the library never configures the
root logger otherwise) and reports readiness through an inherited pipe
(``report_ready``), so whoever started it learns its address without polling.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import json
import logging
import os
import platform
import signal
import stat
import sys
import time
from typing import Any

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


@functools.cache
def libc() -> Any:
    """This process's C library (``dlopen(NULL)``), loaded once: a forked worker inherits
    the handle from its template. Raises ``OSError`` where there is none to load."""
    return ctypes.CDLL(None, use_errno=True)


#: Gives the CPU to another runnable thread, if there is one (the GIL released meanwhile):
#: the spins of an idle worker and of an owner's io thread call it between looks.
yield_cpu = getattr(os, "sched_yield", None) or (lambda: time.sleep(0))


def name_os_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel too (``/proc/<pid>/task/<tid>/comm``,
    15 bytes at most: what ``top -H``, ``ps -L`` and profilers show), Linux only. Python's
    thread names stay inside the interpreter; lumos's own threads in a user's or a worker's
    process are told apart from numpy's or the user's this way."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc().prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def die_with_parent(expected_parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent exits (Linux only).

    Services pass SIGTERM: their stop path then still removes sockets and the object
    store when the driver that started them is SIGKILLed.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc().prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if expected_parent is not None and os.getppid() != expected_parent:
        os._exit(1)  # the parent died before prctl took effect


def process_stopped(pid: int) -> bool:
    """The process is stopped (``SIGSTOP``, Ctrl-Z, a debugger's stop): its state in
    ``/proc/<pid>/stat`` is ``T`` or ``t``. False when it runs, is gone or is unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]  # (the name may hold spaces and parentheses)
    return state in (b"T", b"t")


#: Collector thresholds of the GCS and the raylets (Python's default: 700, 10, 10).
SERVICE_GC_THRESHOLDS = (50_000, 20, 100)


def tune_gc_for_service() -> None:
    """Collect less often in a lumos service process (GCS, raylet), and never look again
    at what start-up allocated (``gc.freeze``).

    Their state (task records, tables, connections) is many small containers with no
    reference cycles to speak of, so at the default thresholds the collector ran every
    700 allocations and freed almost nothing: 40-67% of the GCS's time under a stream of
    tasks (788 young collections freeing 831 objects in one run), and a full collection
    walks every record it holds. Cycles (an exception and its traceback) are still
    collected, every 50,000 allocations. User code never runs in these processes; drivers
    and workers keep Python's defaults.
    """
    gc.freeze()
    gc.set_threshold(*SERVICE_GC_THRESHOLDS)


_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_malloc(mmap_threshold: int, trim_threshold: int) -> bool:
    """Fix glibc malloc's mmap and trim thresholds in this process (a worker); False where
    there is no glibc ``mallopt`` or ``mmap_threshold`` is 0 (glibc's adaptive default kept).

    Fixed values, because the adaptive ones depend on a process's history: a worker whose
    first large free was a 256 KiB numpy temporary trims its heap at 512 KiB, and a task
    that frees two such arrays per call then unmaps and faults in ~100 pages every call.
    """
    global _malloc_mmap_threshold
    if mmap_threshold <= 0 or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = libc().mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    done = bool(mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold))) and bool(
        mallopt(_M_TRIM_THRESHOLD, max(int(trim_threshold), int(mmap_threshold))))
    if done:
        _malloc_mmap_threshold = int(mmap_threshold)
    return done


#: The mmap threshold ``tune_malloc`` fixed in this process; 0: glibc's adaptive one.
_malloc_mmap_threshold = 0


def malloc_mmap_threshold() -> int:
    """Allocations below this many bytes come from malloc's heap in this process (fixed
    by ``tune_malloc``); 0 when not known (glibc's adaptive threshold: 128 KiB at first)."""
    return _malloc_mmap_threshold


#: glibc's size from which ``memcpy`` writes with non-temporal stores (x86-64 only).
_NONTEMPORAL_TUNABLE = "glibc.cpu.x86_non_temporal_threshold"
#: Carries a worker's user's own ``GLIBC_TUNABLES`` (JSON: a string, or null for unset)
#: past the exec that added ours, so the worker can put it back (``restore_user_env``).
_USER_TUNABLES_VAR = "LUMOS_USER_GLIBC_TUNABLES"


def worker_exec_env(nontemporal_bytes: int) -> dict[str, str] | None:
    """The environment to exec a worker (or the fork server) with, or None for this
    process's own: with ``nontemporal_bytes`` > 0 on x86-64 Linux, glibc's ``memcpy``
    in the worker writes copies of at least that many bytes with non-temporal stores.

    glibc derives that size from each core's share of the last-level cache: ~1 MiB on
    most servers, but a VM that reports its host's whole cache (480 MiB for 2 vCPUs, say)
    gets ~190 MiB, and every large copy into the store (a task's return, a worker's
    ``put``) then reads each destination line from memory before overwriting it: a
    1 MiB copy into a store file no cache holds took 175 us, 84 us non-temporal. The
    tunable is read once, when the C library starts, so it is set in the exec's
    environment; a user's own setting of it stands."""
    if nontemporal_bytes <= 0 or not sys.platform.startswith("linux") or \
            platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    user = os.environ.get("GLIBC_TUNABLES")
    if user is not None and _NONTEMPORAL_TUNABLE in user:
        return None
    ours = f"{_NONTEMPORAL_TUNABLE}={int(nontemporal_bytes)}"
    env = dict(os.environ)
    env["GLIBC_TUNABLES"] = f"{user}:{ours}" if user else ours
    env[_USER_TUNABLES_VAR] = json.dumps(user)
    return env


def restore_user_env() -> None:
    """In a worker started with ``worker_exec_env``: ``GLIBC_TUNABLES`` as the user had it
    (this process's C library has read ours already), so the processes a task starts
    inherit the user's environment, not lumos's."""
    saved = os.environ.pop(_USER_TUNABLES_VAR, None)
    if saved is None:
        return
    try:
        user = json.loads(saved)
    except ValueError:
        user = None
    if isinstance(user, str):
        os.environ["GLIBC_TUNABLES"] = user
    else:
        os.environ.pop("GLIBC_TUNABLES", None)


def setup_logging(log_dir: str, name: str, level: int = logging.INFO, logger_name: str = "") -> str:
    """Send this process's log records to ``<log_dir>/<name>.log``: all of them, or with
    ``logger_name`` only that logger's (a worker: ``"lumos"``, see ``lumos_logger_only``)."""
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, f"{name}.log")
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"))
    target = logging.getLogger(logger_name)
    target.handlers[:] = [handler]
    level_name = os.environ.get("LUMOS_LOG_LEVEL")
    wanted: int | str = level_name.upper() if level_name else level
    # setLevel clears every logger's cache: ~50 pages a forked worker would copy for nothing.
    if target.level != (logging.getLevelName(wanted) if isinstance(wanted, str) else wanted):
        target.setLevel(wanted)  # an unknown name raises here, as it always did
    return path


def lumos_logger_only(stream: Any = None) -> None:
    """In a process that runs user code (a worker, its fork server): lumos's own records
    go to lumos's handler (``stream``, or the one ``setup_logging(..., logger_name="lumos")``
    puts there) and stop there; the root logger is left as Python leaves it, so a task's
    ``logging`` calls behave as in a plain process, as in Ray: WARNING and above to its
    stderr, which reaches the driver, and the user's own ``basicConfig`` takes effect."""
    lumos_log = logging.getLogger("lumos")
    lumos_log.propagate = False
    if stream is not None:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(process)d %(name)s: %(message)s"))
        lumos_log.handlers[:] = [handler]
    if lumos_log.level == logging.NOTSET:
        lumos_log.setLevel(logging.INFO)


def describe_exit(code: int) -> str:
    """A child's return code (``Popen.returncode``: a signal's as its negative) in words."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def report_ready(fd: int, info: dict[str, Any]) -> None:
    """Write ``info`` as one JSON line to the inherited pipe ``fd`` and close it."""
    if fd < 0:
        return
    data = (json.dumps(info) + "\n").encode()
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def await_ready(proc: Any, fd: int, timeout_s: float) -> dict[str, Any] | None:
    """Read the ready line a child writes with ``report_ready``; closes ``fd``.

    Returns the line's JSON, or None when ``proc`` exited (or closed the pipe) first.

    Raises:
        TimeoutError: nothing arrived within ``timeout_s``.
    """
    import select
    import time
    deadline = time.monotonic() + timeout_s
    buf = b""
    try:
        while b"\n" not in buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no ready line within {timeout_s:.0f}s")
            ready, _, _ = select.select([fd], [], [], min(left, 0.2))
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                buf += chunk
            elif proc.poll() is not None:
                break
    finally:
        os.close(fd)
    if b"\n" not in buf:
        return None
    return json.loads(buf.split(b"\n", 1)[0])  # type: ignore[no-any-return]


def read_token(path: str) -> bytes:
    with open(path, "rb") as f:
        token = f.read(4096).strip()
    if len(token) < 16:
        raise ValueError(f"cluster token in {path} is too short")
    return token


class UnsafePathError(PermissionError):
    """A directory or file lumos keeps private is not (another owner, a symlink, open
    permissions): someone else may have made it to read or replace what lumos keeps there."""


def check_private_dir(path: str, what: str) -> None:
    """Check with ``lstat`` that ``path`` is a directory (not a symlink), owned by this
    user, with mode 0700.

    Raises:
        UnsafePathError: it is not; the message says what is wrong and what to do.
        FileNotFoundError: it does not exist.
    """
    st = os.lstat(path)
    problem = ""
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != os.geteuid():
        problem = f"belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"
    elif stat.S_IMODE(st.st_mode) != 0o700:
        problem = f"has mode {stat.S_IMODE(st.st_mode):o}, not 700"
    if problem:
        raise UnsafePathError(f"{what} {path} {problem}; lumos will not use it, since another local user "
                              f"could read or replace what it holds. Remove it (or fix its owner and mode) "
                              f"and start again.")


def make_private_dir(path: str, what: str) -> None:
    """Create ``path`` with mode 0700; fail if anything is there already.

    Raises:
        UnsafePathError: ``path`` exists (it may have been made by someone else).
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        try:
            owner = f"owner uid {os.lstat(path).st_uid}"
        except OSError:
            owner = "owner unknown"
        raise UnsafePathError(f"{what} {path} already exists ({owner}); lumos creates a fresh one and will "
                              f"not use one made before it, possibly by another local user. Remove it and "
                              f"start again.") from None
    os.chmod(path, 0o700)  # whatever the umask
    check_private_dir(path, what)


def write_private_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a fresh temporary file renamed into
    place: never through a symlink or into a file someone else made, and readers see
    the old or the new content, never half of it. The directory must be private."""
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def read_private_file(path: str, max_bytes: int = 1 << 20) -> bytes:
    """Read a file lumos wrote with ``write_private_file``: not through a symlink, and
    only if this user owns it and nobody else may write it.

    Raises:
        UnsafePathError: the file is not ours or others may write it.
        OSError: it cannot be read (``FileNotFoundError`` when absent, ``ELOOP`` for a symlink).
    """
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UnsafePathError(f"{path} is not a private file of this user (uid {st.st_uid}, mode "
                                  f"{stat.S_IMODE(st.st_mode):o}); lumos will not trust it. Remove it.")
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)
