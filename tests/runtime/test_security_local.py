"""Another local user cannot read, plant or replace anything of ours.

The attacker runs as ``nobody`` in a forked child (the tests run as root and drop
privileges there). It pre-creates the object store directory, plants symlinks and
records in the session root, or owns the root itself; lumos must refuse with a clear
error, never follow the symlink, and never act on the planted record.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import Any, Callable, Iterator

import pytest

import lumos
from lumos._private import node as node_mod
from lumos._private.config import Config
from lumos._private.node import NodeProcesses, new_session_dir, read_current_cluster, session_root, started_nodes
from lumos._private.object_store.client import StoreClient
from lumos._private.process import UnsafePathError, check_private_dir, write_private_file

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root"),
]

NOBODY = pwd.getpwnam("nobody") if os.geteuid() == 0 else None


def as_nobody(fn: Callable[[], Any]) -> None:
    """Run ``fn`` as ``nobody`` in a forked child; fail the test if it raised."""
    assert NOBODY is not None
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.close(r)
        code = 0
        try:
            os.setgroups([])
            os.setgid(NOBODY.pw_gid)
            os.setuid(NOBODY.pw_uid)
            fn()
        except BaseException as e:
            os.write(w, f"{type(e).__name__}: {e}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the attacker's step failed: {err}"


def attacker_cannot(fn: Callable[[], Any]) -> None:
    """``fn`` as ``nobody`` must fail with PermissionError."""
    def attempt() -> None:
        try:
            fn()
        except PermissionError:
            return
        raise AssertionError("the other user succeeded")
    as_nobody(attempt)


@pytest.fixture
def tmp_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh LUMOS_TMPDIR for this test (0700, ours)."""
    root = tempfile.mkdtemp(prefix="lsec", dir="/tmp")
    monkeypatch.setenv("LUMOS_TMPDIR", root)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A world-writable directory (like /tmp) where the attacker may create things."""
    d = tempfile.mkdtemp(prefix="lsec-shared", dir="/tmp")
    os.chmod(d, 0o1777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- object store directory


def test_store_dir_made_first_by_another_user_stops_the_node(tmp_root, monkeypatch):
    node_id = bytes.fromhex("5ec0" * 8)
    monkeypatch.setattr(node_mod, "random_id", lambda n: node_id)
    session = new_session_dir()
    store = f"/dev/shm/lumos-{os.path.basename(session)}-{node_id.hex()[:8]}"
    as_nobody(lambda: (os.mkdir(store), os.chmod(store, 0o777)))
    node = NodeProcesses(session, Config.resolve())
    try:
        with pytest.raises(UnsafePathError, match="already exists .*owner uid"):
            node.start_raylet("unix:/nonexistent", resources={"CPU": 1.0}, store_bytes=64 << 20,
                              host="127.0.0.1", tie_to_parent=True)
        assert node.procs == [], "a raylet started on a directory someone else made"
    finally:
        node.stop()
        assert os.path.isdir(store), "lumos removed a directory it did not make"
        shutil.rmtree(store)


def _run_raylet(session: str, store: str) -> subprocess.CompletedProcess[str]:
    token = os.path.join(session, "token")
    write_private_file(token, b"a" * 64)
    cmd = [sys.executable, "-m", "lumos._private.raylet.server", "--node-id", "ab" * 16, "--session-dir", session,
           "--token-file", token, "--gcs-address", "unix:/nonexistent", "--resources", '{"CPU": 1}',
           "--store-dir", store, "--object-store-memory", str(64 << 20)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("plant", ["symlink", "other_owner", "open_mode"])
def test_raylet_refuses_a_store_dir_it_does_not_own(tmp_root, shared_dir, plant):
    session = new_session_dir()
    store = f"/dev/shm/lumos-test-sec-{os.getpid()}-{plant}"
    target = os.path.join(shared_dir, "target")
    if plant == "symlink":
        as_nobody(lambda: (os.mkdir(target, 0o700), os.symlink(target, store)))
    elif plant == "other_owner":
        as_nobody(lambda: os.mkdir(store, 0o700))
    else:
        os.mkdir(store, 0o755)
        os.chmod(store, 0o755)
    try:
        out = _run_raylet(session, store)
        assert out.returncode == 1, out
        with open(os.path.join(session, "logs", f"raylet-{'ab' * 6}.log")) as f:
            log = f.read()
        assert f"object store directory {store}" in log and "will not use it" in log, log
        assert os.path.lexists(store), "the raylet removed a directory it did not check"
        if plant == "symlink":
            assert os.listdir(target) == []
    finally:
        if os.path.islink(store):
            os.unlink(store)
        else:
            shutil.rmtree(store, ignore_errors=True)


def test_planted_symlinks_in_the_store_are_not_followed(tmp_path):
    store = tmp_path / "store"
    store.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    oid = b"\x01" * 20
    grant, final = str(store / (oid.hex() + ".w")), str(store / oid.hex())
    os.symlink(victim, grant)
    client = StoreClient(str(store), 1, 1 << 30, 0)
    try:
        client.write(oid, grant, final, 0, 16, False, 16, lambda dest, copy: copy(dest, memoryview(b"x" * 16)),
                     keep_mapping=False)
        assert victim.read_bytes() == b"victim"
        assert not os.path.islink(final)
        with open(final, "rb") as f:
            assert f.read() == b"x" * 16
        # A slot the raylet would rename into place, replaced by a symlink: refused.
        os.symlink(victim, grant)
        with pytest.raises(OSError):
            client.write(b"\x02" * 20, grant, str(store / "two"), 1, 16, True, 16,
                         lambda dest, copy: copy(dest, memoryview(b"y" * 16)), keep_mapping=False)
        assert victim.read_bytes() == b"victim"
        # A reader never maps a symlink in place of a sealed object.
        os.symlink(victim, str(store / ("03" * 20)))
        with pytest.raises(OSError):
            client.view(b"\x03" * 20)
    finally:
        client.close()


# --------------------------------------------------------------------------- session root


def test_default_root_is_per_user_and_private(monkeypatch, tmp_path):
    monkeypatch.delenv("LUMOS_TMPDIR", raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    assert session_root() == f"/tmp/lumos-{os.geteuid()}"
    check_private_dir(session_root(), "root")
    xdg = tmp_path / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    assert session_root() == str(xdg / "lumos")
    check_private_dir(str(xdg / "lumos"), "root")


def test_xdg_runtime_dir_of_another_user_is_not_used(monkeypatch, shared_dir):
    monkeypatch.delenv("LUMOS_TMPDIR", raising=False)
    xdg = os.path.join(shared_dir, "xdg")
    as_nobody(lambda: os.mkdir(xdg, 0o777))
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    assert session_root() == f"/tmp/lumos-{os.geteuid()}"


@pytest.mark.parametrize("plant", ["other_owner", "symlink", "open_mode"])
def test_session_root_not_private_to_us_is_refused(monkeypatch, shared_dir, plant):
    root = os.path.join(shared_dir, "root")
    if plant == "other_owner":
        as_nobody(lambda: os.mkdir(root, 0o700))
    elif plant == "symlink":
        mine = os.path.join(shared_dir, "mine")
        os.mkdir(mine, 0o700)
        as_nobody(lambda: os.symlink(mine, root))
    else:
        os.mkdir(root)
        os.chmod(root, 0o777)
    monkeypatch.setenv("LUMOS_TMPDIR", root)
    with pytest.raises(UnsafePathError, match="lumos session root .* will not use it"):
        lumos.init(num_cpus=1, include_dashboard=False)
    assert not lumos.is_initialized()
    with pytest.raises(UnsafePathError):
        lumos.init(address="auto")
    # The command line says it in one line (it printed a traceback).
    out = subprocess.run([sys.executable, "-m", "lumos.cli", "start", "--head", "--port", "0", "--num-cpus", "1"],
                         capture_output=True, text=True, timeout=60, env=dict(os.environ, LUMOS_TMPDIR=root))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.startswith("lumos start: error: lumos session root") and "will not use it" in out.stderr


def test_another_user_cannot_plant_records_in_our_root(tmp_root):
    started = node_mod.started_dir()
    attacker_cannot(lambda: open(os.path.join(tmp_root, "current_cluster.json"), "w"))
    attacker_cannot(lambda: os.symlink("/etc/passwd", os.path.join(tmp_root, "current_cluster.json")))
    attacker_cannot(lambda: open(os.path.join(started, "evil.json"), "w"))
    attacker_cannot(lambda: os.listdir(tmp_root))
    with pytest.raises(ConnectionError, match="no lumos cluster was started"):
        lumos.init(address="auto")


def test_records_that_are_not_our_private_files_are_ignored(tmp_root):
    """Records another uid owns (or a symlink) are never trusted: ``lumos stop`` does
    not signal the pids they list, ``init(address="auto")`` does not use them."""
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        evil = {"node_id": "e" * 32, "processes": [{"pid": sleeper.pid, "create_time": 0}],
                "store_dir": "/dev/shm/lumos-x", "session_dir": "/", "gcs_address": "127.0.0.1:1"}
        path = os.path.join(node_mod.started_dir(), "evil.json")
        write_private_file(path, json.dumps(evil).encode())
        os.chown(path, NOBODY.pw_uid, NOBODY.pw_gid)
        current = os.path.join(tmp_root, "current_cluster.json")
        os.symlink(path, current)
        assert started_nodes() == []
        with pytest.raises(OSError):
            read_current_cluster()
        from lumos.cli import main
        assert main(["stop"]) == 0
        assert sleeper.poll() is None, "lumos stop signalled a pid from a record it does not own"
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()


def test_private_files_are_written_through_a_fresh_name_never_a_symlink(tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"victim")
    target = tmp_path / "token"
    os.symlink(victim, target)
    write_private_file(str(target), b"secret")
    assert victim.read_bytes() == b"victim"
    assert not os.path.islink(target) and target.read_bytes() == b"secret"
    assert (os.stat(target).st_mode & 0o777) == 0o600
    assert set(os.listdir(tmp_path)) == {"victim", "token"}  # no temporary file left


def test_session_directory_and_token_are_private(cluster):
    session = cluster.address_info["session_dir"]
    check_private_dir(os.path.dirname(session), "root")
    check_private_dir(session, "session")
    for sub in ("logs", "sockets"):
        check_private_dir(os.path.join(session, sub), sub)
    assert os.stat(os.path.join(session, "token")).st_mode & 0o077 == 0
    attacker_cannot(lambda: open(os.path.join(session, "token"), "rb"))


# --------------------------------------------------------------------------- a running cluster (last: module scope)


def test_store_dir_is_private_on_a_running_node(cluster):
    (n,) = lumos.nodes()
    check_private_dir(n["ObjectStoreSocketName"], "object store directory")
    attacker_cannot(lambda: open(os.path.join(n["ObjectStoreSocketName"], "planted"), "wb"))
