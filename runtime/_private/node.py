"""Starting and stopping a node's processes (GCS, raylet) and its session directory.

Used by ``lumos.init()`` (a private local cluster that dies with its driver) and by
``lumos start`` (long-lived clusters). Everything lives under a per-user root
(``session_root``): ``$LUMOS_TMPDIR`` if set, else ``$XDG_RUNTIME_DIR/lumos`` when that
directory is this user's, else ``/tmp/lumos-<uid>``. The root is created 0700 and
checked (owner, mode, not a symlink) on every use, so another local user can neither
read it nor plant files in it; private files are written to a fresh temporary name
(``O_EXCL | O_NOFOLLOW``) and renamed into place.

```
<root>/                              0700, this user's
    current_cluster.json             the cluster `lumos start --head` started here
    started/<node id>.json           each node `lumos start` started (for `lumos stop`)
    session_<time>_<pid>_<rand>/     0700
        token                        the cluster token (HMAC key of every connection), 0600
        gcs.pid                      the GCS a keeper runs (`lumos start --head` on Redis), 0600
        logs/                        gcs.log, keeper.log, raylet-*.log, worker-*.log, worker-*.out, ...
        sockets/                     gcs.sock, raylet-*.sock, driver-*.sock, worker-*.sock
/dev/shm/lumos-<session>-<node>/     the node's object store, made 0700 before its raylet starts
    lumos.lock                       flock'ed by the raylet while it lives; names its spill directory
```

A store outlives its node when the raylet is killed with SIGKILL (the kernel's OOM
killer, Slurm ending a job step, ``kill -9``): its files stay in ``/dev/shm``, which is
memory, until reboot, and its spill directory on disk. Every node start removes this
user's stores whose lock no live process holds, with the spill directories they name
(``sweep_dead_stores``). Session directories of clusters that ended are removed by each
raylet a few seconds after it starts, all but the newest ``session_dirs_kept``
(``sweep_old_sessions``).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from typing import Any

from lumos._private.config import Config, warm_modules_for_node
from lumos._private.ids import random_id
from lumos._private.object_store.spill_io import node_spill_dir
from lumos._private.process import (await_ready, check_private_dir, make_private_dir,
                                    read_private_file, write_private_file)

logger = logging.getLogger(__name__)


def _ours(path: str) -> bool:
    """``path`` is a real directory (not a symlink) of this user that nobody else may write."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def session_root() -> str:
    """This user's lumos root, created 0700 if missing and checked on every call.

    Raises:
        UnsafePathError: the root exists but is not private to this user.
    """
    root = os.environ.get("LUMOS_TMPDIR")
    if not root:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        # Not /tmp/lumos: with an editable install, a directory named like the package in
        # the working directory (often /tmp) would shadow it as a namespace package.
        root = os.path.join(xdg, "lumos") if xdg and _ours(xdg) else f"/tmp/lumos-{os.geteuid()}"
    root = os.path.abspath(root)
    try:
        os.mkdir(root, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(root), exist_ok=True)
        os.mkdir(root, 0o700)
    check_private_dir(root, "lumos session root")
    return root


def __getattr__(name: str) -> Any:
    # ``node.ROOT`` (a constant before the root became per user): the checked root, now.
    if name == "ROOT":
        return session_root()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: In a head's session directory: the GCS's ``HOST:PORT``, next to its ``token``.
GCS_ADDRESS_FILE = "gcs_address"
_LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0", ""}


def find_local_token(address: str) -> tuple[str | None, str]:
    """The token of the running cluster at ``address`` (``HOST:PORT``) that this user
    started on this machine: ``(token, the file it was read from)``, or ``(None, a
    sentence saying where it looked)``. Only this user's checked root is read; a session
    counts while its GCS socket exists (a stopped cluster's directory may stay)."""
    host, _, port = address.rpartition(":")
    root = session_root()
    pattern = os.path.join(root, "session_*", GCS_ADDRESS_FILE)
    found: list[tuple[float, str]] = []
    for path in glob.glob(pattern):
        session = os.path.dirname(path)
        try:
            recorded = read_private_file(path).decode().strip()
        except (OSError, UnicodeDecodeError):
            continue
        r_host, _, r_port = recorded.rpartition(":")
        same_host = r_host == host or (r_host in _LOOPBACK and host in _LOOPBACK)
        if r_port == port and same_host and os.path.exists(os.path.join(session, "sockets", "gcs.sock")):
            found.append((os.path.getmtime(path), session))
    if not found:
        return None, (f"no running cluster of this user on this machine has the address {address} "
                      f"(looked in {pattern})")
    token_path = os.path.join(max(found)[1], "token")
    try:
        return read_private_file(token_path).decode().strip(), token_path
    except (OSError, UnicodeDecodeError) as e:
        return None, f"the token file {token_path} of the cluster at {address} could not be read: {e}"


def current_cluster_path() -> str:
    """Where ``lumos start --head`` records the cluster for ``init(address="auto")``."""
    return os.path.join(session_root(), "current_cluster.json")


def read_current_cluster() -> dict[str, Any] | None:
    """The record ``lumos start --head`` left on this machine, or None.

    Raises:
        UnsafePathError: the root or the file is not private to this user.
    """
    try:
        record = json.loads(read_private_file(current_cluster_path()))
    except (FileNotFoundError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def write_current_cluster(record: dict[str, Any]) -> None:
    write_private_file(current_cluster_path(), json.dumps(record, indent=1).encode())


def forget_current_cluster(node_id: str | None = None) -> None:
    """Remove the record (only if it names ``node_id``, when given)."""
    path = current_cluster_path()
    if node_id is not None:
        try:
            current = read_current_cluster()
        except OSError:
            return
        if current is None or current.get("node_id") != node_id:
            return
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


#: Where the nodes' object stores are (``lumos-<session>-<node>`` each).
SHM_DIR = "/dev/shm"
#: The lock file in a store directory (``_lock_store``).
STORE_LOCK = "lumos.lock"
#: A store directory changed more recently than this is never swept: its maker may be
#: between creating it and locking it.
SWEEP_MIN_AGE_S = 60.0


def _lock_store(store_dir: str, spill_dir: str) -> int:
    """Create the lock file of the new store ``store_dir``, naming the node's spill
    directory, and lock it (``flock``): the descriptor, which the raylet inherits; the
    lock lasts while either holds it open."""
    fd = os.open(os.path.join(store_dir, STORE_LOCK), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, spill_dir.encode())
    return fd


def sweep_dead_stores(shm_dir: str = SHM_DIR) -> list[tuple[str, int]]:
    """Remove this user's object store directories whose lock no live process holds (their
    raylet and the process that started it are gone), and the spill directory each lock
    file names: ``[(store path, bytes it held)]``.

    Only directories of this user (not symlinks) named as stores, unchanged for
    ``SWEEP_MIN_AGE_S``, holding a lock file: a store made by a lumos without the lock
    file, or by anyone else, is left alone. A frozen (SIGSTOPped) raylet still holds its
    lock, so its store is kept. A named spill directory is removed only if it is a
    directory of this user named as one (``node-...``), not a symlink."""
    removed: list[tuple[str, int]] = []
    for entry, _ in _settled_dirs(shm_dir, "lumos-session_", time.time()):
        try:
            fd = os.open(os.path.join(entry.path, STORE_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # held: a live node's
            size = _tree_bytes(entry.path)
            spill = os.read(fd, 4096).decode(errors="replace")
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append((entry.path, size))
            if spill and os.path.basename(spill).startswith("node-") and _ours(spill):
                shutil.rmtree(spill, ignore_errors=True)
        finally:
            os.close(fd)
    return removed


def _settled_dirs(parent: str, prefix: str, now: float) -> list[tuple[os.DirEntry[str], os.stat_result]]:
    """The directories in ``parent`` named ``prefix...`` that are this user's, not
    symlinks, and unchanged for ``SWEEP_MIN_AGE_S`` (what a sweep may look at)."""
    found = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return found
    uid = os.geteuid()
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == uid and now - st.st_mtime >= SWEEP_MIN_AGE_S:
            found.append((entry, st))
    return found


def _tree_bytes(path: str) -> int:
    """Bytes the files under ``path`` take (symlinks not followed)."""
    total = 0
    for top, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
            except OSError:
                pass
    return total


#: Session directories one sweep removes at most (the oldest): a first sweep of a root
#: that held thousands stays short, and later starts take the rest.
SWEEP_MAX_SESSIONS = 200


def sweep_old_sessions(root: str, keep: int, now: float | None = None) -> list[tuple[str, int]]:
    """Remove the session directories in ``root`` of clusters that ended, all but the
    newest ``keep`` of them and at most ``SWEEP_MAX_SESSIONS``: ``[(path, bytes it held)]``,
    oldest first. Each start makes a session directory (logs, spill files), and nothing
    else removes them: a user's root grew past a gigabyte in a day of notebooks and
    scripts, and under ``$XDG_RUNTIME_DIR`` (a small tmpfs, memory) that is felt.

    A session counts as ended when nothing listens on its sockets: a cleanly stopped
    cluster removed them, a killed one left files no process accepts on. A live
    cluster's session (a frozen one too: the kernel still accepts its connections), one
    changed within ``SWEEP_MIN_AGE_S`` (its node may be starting), the one
    ``current_cluster.json`` names, and anything that is not a plain directory of this
    user named ``session_*`` stay. ``keep`` <= 0 keeps them all."""
    removed: list[tuple[str, int]] = []
    if keep <= 0:
        return removed
    now = time.time() if now is None else now
    named = None
    try:
        named = json.loads(read_private_file(os.path.join(root, "current_cluster.json"))).get("session_dir")
    except (OSError, ValueError, AttributeError):
        pass
    ended = [(st.st_mtime, entry.path) for entry, st in _settled_dirs(root, "session_", now)
             if entry.path != named and not _session_listens(entry.path)]
    ended.sort(reverse=True)
    for _, path in reversed(ended[keep:][-SWEEP_MAX_SESSIONS:]):
        size = _tree_bytes(path)
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            removed.append((path, size))
    return removed


def _session_listens(session: str) -> bool:
    """Some socket in ``session``'s ``sockets`` directory accepts connections (when it
    cannot tell, it says so: the session is kept)."""
    sockets = os.path.join(session, "sockets")
    try:
        names = os.listdir(sockets)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    for name in names:
        path = os.path.join(sockets, name)
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.setblocking(False)
        try:
            probe.connect(path)
            return True
        except OSError as e:
            if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                return True  # (EAGAIN: a listener with a full backlog)
        finally:
            probe.close()
    return False


def new_session_dir() -> str:
    stamp = time.strftime("%Y-%m-%d_%H-%M-%S")
    path = os.path.join(session_root(), f"session_{stamp}_{os.getpid()}_{secrets.token_hex(3)}")
    make_private_dir(path, "session directory")
    os.mkdir(os.path.join(path, "logs"), 0o700)
    os.mkdir(os.path.join(path, "sockets"), 0o700)
    return path


#: The prefix of the labels every node has (Ray's reserved one): its id, and the model of
#: its GPUs when they were detected (``node_labels``).
DEFAULT_LABEL_PREFIX = "ray.io/"
#: The default label naming the node (its id in hex).
NODE_ID_LABEL = DEFAULT_LABEL_PREFIX + "node-id"


def check_node_labels(labels: Any) -> None:
    """Refuse labels a node cannot be started with: not a dict of str -> str, or a key
    under ``DEFAULT_LABEL_PREFIX``."""
    if labels is None:
        return
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise TypeError(f"node labels must be a dict of str -> str, got {labels!r}")
    for key in labels:
        if key.startswith(DEFAULT_LABEL_PREFIX):
            raise ValueError(f"node label {key!r}: keys beginning {DEFAULT_LABEL_PREFIX!r} are the labels every "
                             "node has (ray.io/node-id, ray.io/accelerator-type); choose another key")


def node_labels(labels: dict[str, str], node_id: bytes, resources: dict[str, float]) -> dict[str, str]:
    """A node's labels: the ones it was started with, and Ray's default ones
    (``ray.io/node-id``, ``ray.io/accelerator-type``), which ``label_selector`` reads as
    in Ray."""
    out = dict(labels)
    out[NODE_ID_LABEL] = node_id.hex()
    for name in resources:
        if name.startswith("accelerator_type:"):
            out[DEFAULT_LABEL_PREFIX + "accelerator-type"] = name.split(":", 1)[1]
            break
    return out


def detect_gpus() -> tuple[int, str | None]:
    """GPUs visible to this process (``CUDA_VISIBLE_DEVICES`` if set, else ``nvidia-smi``)
    and the accelerator type of the first (``accelerator_type_of``; None without a GPU).
    ``nvidia-smi`` runs at most once."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = len([x for x in visible.split(",") if x.strip() and x.strip() != "-1"])
        return count, detect_accelerator_type() if count else None
    names = _nvidia_gpu_names()
    return len(names), accelerator_type_of(names[0]) if names else None


def _nvidia_gpu_names() -> list[str]:
    """The names ``nvidia-smi -L`` gives this machine's GPUs ("NVIDIA A100-SXM4-40GB"), in
    index order; [] without nvidia-smi or when it fails."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    names = []
    for line in out.stdout.splitlines():  # "GPU 0: NVIDIA H200 (UUID: GPU-...)"
        if line.startswith("GPU ") and ":" in line:
            names.append(line.split(":", 1)[1].split(" (UUID", 1)[0].strip())
    return names


def accelerator_type_of(gpu_name: str) -> str | None:
    """The accelerator type Ray names a GPU model by (``accelerator_type=`` and the node
    resource ``accelerator_type:<type>``): the model token after the vendor word, without
    its SKU suffix ("Tesla V100-SXM2-16GB" -> "V100", "NVIDIA A100-SXM4-40GB" -> "A100"),
    with the all-capital words before it ("NVIDIA RTX PRO 6000 Blackwell" -> "RTX-PRO-6000");
    a name without such a token is the product name, hyphen-joined ("NVIDIA GeForce RTX
    4090" -> "GeForce-RTX-4090"). None for an empty name."""
    words = gpu_name.split()
    lead: list[str] = []
    for word in words[1:]:
        model = word.split("-", 1)[0]
        if model.isalnum() and model.upper() == model and any(c.isdigit() for c in model):
            found = "-".join(lead + [model])
            if len(found) > 1:  # (a lone digit names nothing)
                return found
            break
        if not (word.isalpha() and word.isupper()):
            break
        lead.append(word)
    rest = words[1:] if words and words[0] == "NVIDIA" else words
    return "-".join(rest) or None


def detect_accelerator_type() -> str | None:
    """The accelerator type of this machine's first NVIDIA GPU (``accelerator_type_of``),
    None without one."""
    names = _nvidia_gpu_names()
    return accelerator_type_of(names[0]) if names else None


def default_store_bytes() -> int:
    import psutil
    total = psutil.virtual_memory().total
    want = int(total * 0.3)
    try:
        shm = shutil.disk_usage("/dev/shm")
        want = min(want, int(shm.free * 0.8))
    except OSError:
        pass
    return max(want, 64 * 1024 * 1024)


def node_resources(num_cpus: float | None, num_gpus: float | None, resources: dict[str, float] | None,
                   memory: int | None) -> dict[str, float]:
    import psutil
    out: dict[str, float] = {}
    out["CPU"] = float(os.cpu_count() or 1) if num_cpus is None else float(num_cpus)
    gpus, model = detect_gpus() if num_gpus is None else (num_gpus, detect_accelerator_type() if num_gpus else None)
    if gpus:
        out["GPU"] = float(gpus)
        # As Ray's nodes do: a task or actor asks for a model with ``accelerator_type=``.
        if model and not any(name.startswith("accelerator_type:") for name in resources or {}):
            out[f"accelerator_type:{model}"] = 1.0
    out["memory"] = float(memory if memory is not None else int(psutil.virtual_memory().available * 0.7))
    for name, amount in (resources or {}).items():
        if name in ("CPU", "GPU"):
            raise ValueError(f"use num_cpus/num_gpus instead of resources={{'{name}': ...}}")
        out[name] = float(amount)
    return out


def _startup_error(logs: str, what: str) -> tuple[str, str]:
    """Where a process that died starting up said why: (its newest non-empty log or output
    file, the last error line there, '' if none). Its log is ``<what>-<id>.log``, its
    output ``<what>.out``."""
    import glob
    files = [f for f in glob.glob(os.path.join(logs, f"{what}*.log")) + [os.path.join(logs, f"{what}.out")]
             if os.path.isfile(f) and os.path.getsize(f) > 0]
    if not files:
        return logs, ""
    newest = max(files, key=os.path.getmtime)
    try:
        with open(newest, "rb") as f:
            f.seek(max(0, os.path.getsize(newest) - 16384))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return newest, ""
    import re
    logged = [m.group(1) for m in (re.search(r" (?:ERROR|CRITICAL) \d+ [^:]+: (.*)", ln) for ln in lines) if m]
    raised = [ln.strip() for ln in lines if re.match(r"\w*(Error|Exception)\b", ln)]  # a traceback's last line
    found = logged or raised
    return newest, (found[-1][-500:] if found else "")


class NodeProcesses:
    """The GCS (head only) and raylet of one node, started as child processes."""

    def __init__(self, session_dir: str, config: Config) -> None:
        self.session_dir = session_dir
        self.config = warm_modules_for_node(config)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.gcs_address: tuple[str, int] | None = None
        self.gcs_unix = os.path.join(session_dir, "sockets", "gcs.sock")
        self.raylet_socket = ""
        self.raylet_address: tuple[str, int] | None = None
        self.node_id = b""
        self.store_dir = ""
        #: This process's descriptor of the store's lock file (the raylet has its own).
        self._store_lock: int | None = None
        self.token_path = os.path.join(session_dir, "token")
        self.gcs_proc: subprocess.Popen[bytes] | None = None
        self.raylet_proc: subprocess.Popen[bytes] | None = None

    def write_token(self, token: bytes) -> None:
        write_private_file(self.token_path, token)

    def _spawn(self, args: list[str], tie_to_parent: bool,
               keep_fds: tuple[int, ...] = ()) -> tuple[subprocess.Popen[bytes], int]:
        r, w = os.pipe()
        cmd = [sys.executable, "-m", *args, "--ready-fd", str(w)]
        if tie_to_parent:
            cmd += ["--die-with-parent", str(os.getpid())]
        log = open(os.path.join(self.session_dir, "logs", f"{args[0].rsplit('.', 2)[-2]}.out"), "ab")
        try:
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    pass_fds=(w, *keep_fds), close_fds=True,
                                    start_new_session=True)  # a kernel interrupt must not reach it
        finally:
            os.close(w)
            log.close()
        self.procs.append(proc)
        return proc, r

    def _await_ready(self, proc: subprocess.Popen[bytes], fd: int, what: str, timeout_s: float) -> dict[str, Any]:
        try:
            info = await_ready(proc, fd, timeout_s)
        except TimeoutError:
            raise TimeoutError(f"{what} did not start within {timeout_s:.0f}s; see {self.session_dir}/logs") from None
        if info is None:
            try:
                code = proc.wait(5.0)  # its ready pipe closed as it exits: wait for the code
            except subprocess.TimeoutExpired:
                code = None
            path, cause = _startup_error(os.path.join(self.session_dir, "logs"), what)
            raise RuntimeError(f"{what} exited during start-up (exit code {code})"
                               + (f": {cause}" if cause else "") + f"; see {path}")
        return info

    def start_gcs_and_raylet(self, *, resources: dict[str, float], store_bytes: int, host: str,
                             gcs_port: int, private: bool, storage: str | None = None,
                             labels: dict[str, str] | None = None,
                             tie_to_parent: bool | None = None, keeper: bool = False) -> None:
        """Start a head node: GCS and raylet in parallel (the raylet waits for the GCS socket).

        ``private``: the GCS ends when the first driver disconnects (``lumos.init()``).
        ``tie_to_parent`` (default: ``private``): the processes die with this process.
        ``storage``: the GCS storage URL (default: the config's ``gcs_storage``).
        ``keeper``: run the GCS under a keeper that starts it again when it dies
        (``gcs/keeper.py``; for a GCS on durable storage); ``gcs_proc`` is the keeper then.
        """
        check_node_labels(labels)
        tie = private if tie_to_parent is None else tie_to_parent
        cfg = self.config.to_json()
        # The URL may hold a Redis password: it goes in a private file, not on a command line.
        storage_file = os.path.join(self.session_dir, "gcs_storage")
        write_private_file(storage_file, (storage or self.config.gcs_storage).encode())
        gcs_args = ["lumos._private.gcs.server", "--session-dir", self.session_dir,
                    "--token-file", self.token_path, "--host", host, "--port", str(gcs_port),
                    "--unix-path", self.gcs_unix, "--storage-file", storage_file, "--config", cfg]
        if private:
            gcs_args.append("--private")
        if keeper:
            gcs, gcs_fd = self._spawn(["lumos._private.gcs.keeper", "--session-dir", self.session_dir,
                                       "--give-up-s", str(self.config.gcs_reconnect_timeout_s),
                                       "--gcs-args", json.dumps(gcs_args)], tie_to_parent=tie)
        else:
            gcs, gcs_fd = self._spawn(gcs_args, tie_to_parent=tie)
        self.gcs_proc = gcs
        #: How the GCS was started (``lumos.testing.Cluster.restart_gcs`` starts it again).
        self.gcs_spawn_args = (gcs_args, tie)
        raylet, raylet_fd = self._start_raylet(f"unix:{self.gcs_unix}", resources, store_bytes, host,
                                               head=True, tie_to_parent=tie, labels=labels)
        try:
            info = self._await_ready(gcs, gcs_fd, "gcs", 30)
        except BaseException:
            os.close(raylet_fd)
            raise
        self.gcs_address = (info["host"], int(info["port"]))
        # So a driver of this user on this machine finds the token by the address (issue 14).
        write_private_file(os.path.join(self.session_dir, GCS_ADDRESS_FILE),
                           f"{info['host']}:{int(info['port'])}".encode())
        self._finish_raylet(raylet, raylet_fd)

    def start_raylet(self, gcs_address: str, *, resources: dict[str, float], store_bytes: int, host: str,
                     tie_to_parent: bool, labels: dict[str, str] | None = None) -> None:
        check_node_labels(labels)
        raylet, fd = self._start_raylet(gcs_address, resources, store_bytes, host, head=False,
                                        tie_to_parent=tie_to_parent, labels=labels)
        self._finish_raylet(raylet, fd)

    def _start_raylet(self, gcs_address: str, resources: dict[str, float], store_bytes: int, host: str,
                      head: bool, tie_to_parent: bool,
                      labels: dict[str, str] | None) -> tuple[subprocess.Popen[bytes], int]:
        self.node_id = random_id(16)
        for path, size in sweep_dead_stores():
            logger.info("removed %s, the object store of a node that died without removing it (%.1f MiB of "
                        "shared memory)", path, size / (1 << 20))
        store_dir = f"{SHM_DIR}/lumos-{os.path.basename(self.session_dir)}-{self.node_id.hex()[:8]}"
        # Made here, 0700, before the raylet (whose command line names it) exists: another
        # user who made it first could replace sealed objects that workers unpickle.
        make_private_dir(store_dir, "object store directory")
        self.store_dir = store_dir  # ours from here on: stop() removes it
        # The raylet inherits the lock (and holds it while it lives).
        self._store_lock = _lock_store(store_dir, node_spill_dir(self.config.object_spilling_directory,
                                                                 self.session_dir, self.node_id))
        args = ["lumos._private.raylet.server", "--node-id", self.node_id.hex(),
                "--session-dir", self.session_dir, "--token-file", self.token_path,
                "--gcs-address", gcs_address, "--resources", json.dumps(resources),
                "--store-dir", self.store_dir, "--object-store-memory", str(store_bytes),
                "--node-ip", host, "--labels", json.dumps(labels or {}), "--config", self.config.to_json()]
        if head:
            args.append("--head")
        proc, fd = self._spawn(args, tie_to_parent=tie_to_parent, keep_fds=(self._store_lock,))
        self.raylet_proc = proc
        return proc, fd

    def _finish_raylet(self, proc: subprocess.Popen[bytes], fd: int) -> None:
        info = self._await_ready(proc, fd, "raylet", 60)
        self.raylet_socket = info["unix_path"]
        self.raylet_address = (info["host"], int(info["port"]))

    def kill_raylet(self) -> None:
        """SIGKILL the raylet (its workers follow through their parent-death signal), no grace."""
        proc = self.raylet_proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if proc is not None:
            proc.wait(5.0)
        self._remove_store()
        if self.raylet_socket:
            try:
                os.unlink(self.raylet_socket)
            except FileNotFoundError:
                pass

    def _remove_store(self) -> None:
        """Remove the store and spill directories of the node this object started (its raylet is gone)."""
        if self.store_dir:
            shutil.rmtree(self.store_dir, ignore_errors=True)
            shutil.rmtree(node_spill_dir(self.config.object_spilling_directory, self.session_dir, self.node_id),
                          ignore_errors=True)
        if self._store_lock is not None:
            os.close(self._store_lock)
            self._store_lock = None

    def stop(self, timeout_s: float = 5.0, remove_sockets: bool = True) -> None:
        """Stop what this object started: SIGTERM, then SIGKILL after ``timeout_s``."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + timeout_s
        for proc in reversed(self.procs):
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(2.0)
        self.procs.clear()
        self._remove_store()
        if remove_sockets:
            shutil.rmtree(os.path.join(self.session_dir, "sockets"), ignore_errors=True)
        elif self.raylet_socket:
            try:
                os.unlink(self.raylet_socket)
            except FileNotFoundError:
                pass


# ----------------------------------------------------------------------------- lumos start / stop

def started_dir() -> str:
    """One JSON record per node that ``lumos start`` started on this machine (for ``lumos stop``),
    in a private directory under the checked root."""
    path = os.path.join(session_root(), "started")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private_dir(path, "lumos started-nodes directory")
    return path


def process_identity(pid: int) -> dict[str, Any]:
    """A pid plus its start time, so ``lumos stop`` never signals a reused pid."""
    import psutil
    try:
        created = psutil.Process(pid).create_time()
    except psutil.Error:
        created = 0.0
    return {"pid": pid, "create_time": created}


def record_started_node(record: dict[str, Any]) -> str:
    """Write the record of a node ``lumos start`` started; returns its path."""
    path = os.path.join(started_dir(), f"{record['node_id']}.json")
    write_private_file(path, json.dumps(record, indent=1).encode())
    return path


def started_nodes() -> list[tuple[str, dict[str, Any]]]:
    """``(path, record)`` of every node ``lumos start`` recorded on this machine.

    Only this user's private files count: ``lumos stop`` signals the pids they list.
    """
    out = []
    where = started_dir()
    for name in sorted(os.listdir(where)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(where, name)
        try:
            record = json.loads(read_private_file(path))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            out.append((path, record))
    return out


def _same_process(ident: dict[str, Any]) -> Any:
    """The psutil process for a recorded identity, or None if it is gone or the pid was reused."""
    import psutil
    try:
        p = psutil.Process(int(ident["pid"]))
        if ident.get("create_time") and abs(p.create_time() - float(ident["create_time"])) > 0.01:
            return None
        if p.status() == psutil.STATUS_ZOMBIE:
            return None
        return p
    except (psutil.Error, KeyError, ValueError, TypeError):
        return None


def recorded_alive(record: dict[str, Any]) -> bool:
    return any(_same_process(ident) is not None for ident in record.get("processes", []))


def stop_recorded_node(record: dict[str, Any], timeout_s: float = 5.0) -> list[int]:
    """End the processes of one recorded node (SIGTERM, then SIGKILL) and remove its files.

    Raylets first, so their workers go with them, then the GCS. A GCS under a keeper is
    stopped by it (the keeper passes the signal on), or directly when the keeper is gone.
    Returns the pids signalled.
    """
    import psutil
    procs = []
    for ident in record.get("processes", []):
        p = _same_process(ident)
        if p is not None:
            procs.append(p)
    kept = None
    if record.get("gcs_keeper") and record.get("session_dir"):
        from lumos._private.gcs.keeper import read_gcs_identity
        ident = read_gcs_identity(str(record["session_dir"]))
        kept = _same_process(ident) if ident is not None else None
        if kept is not None and kept.pid not in {p.pid for p in procs}:
            try:
                keeper_alive = kept.ppid() in {p.pid for p in procs}
            except psutil.Error:
                keeper_alive = False
            if not keeper_alive:
                procs.append(kept)
    for p in procs:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=2.0)
    if kept is not None:
        try:  # still up: its keeper did not stop it in time (or was killed meanwhile)
            if kept.is_running() and kept.status() != psutil.STATUS_ZOMBIE:
                kept.kill()
                kept.wait(2.0)
        except psutil.Error:
            pass
    store = record.get("store_dir")
    if store and os.path.basename(store).startswith("lumos-"):
        shutil.rmtree(store, ignore_errors=True)
    session = record.get("session_dir")
    if session:
        shutil.rmtree(os.path.join(session, "sockets"), ignore_errors=True)
    return [p.pid for p in procs]
