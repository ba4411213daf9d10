"""A node killed with SIGKILL leaves its object store in ``/dev/shm`` (memory, until
reboot) and its spill directory; the next node start removes the stores no live process
holds, with the spill directories they name (``node.sweep_dead_stores``), and never a
live, frozen, young or foreign one."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import textwrap
import time
from typing import Iterator

import psutil
import pytest

import lumos
from lumos._private import node as node_mod

from ..conftest import process_gone, wait_for

pytestmark = pytest.mark.timeout(120)

_OLD = time.time() - 2 * node_mod.SWEEP_MIN_AGE_S


def _spill_dir(parent: str, name: str) -> str:
    path = os.path.join(parent, name)
    os.makedirs(path, 0o700)
    with open(os.path.join(path, "spilled"), "wb") as f:
        f.write(b"s" * 4096)
    return path


def _store(shm: str, name: str, locked: bool = True, old: bool = True, spill: str = "") -> str:
    path = os.path.join(shm, f"lumos-session_{name}-0123abcd")
    os.mkdir(path, 0o700)
    with open(os.path.join(path, "0" * 40), "wb") as f:
        f.write(b"x" * 65536)
    if locked:
        with open(os.path.join(path, node_mod.STORE_LOCK), "w") as f:
            f.write(spill)
    if old:
        os.utime(path, (_OLD, _OLD))
    return path


_HOLD = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
            if p.stdout is not None:
                p.stdout.close()


def _hold(procs: list[subprocess.Popen[str]], store: str) -> subprocess.Popen[str]:
    """A process (standing for a raylet) that holds ``store``'s lock."""
    p = subprocess.Popen([sys.executable, "-c", _HOLD, os.path.join(store, node_mod.STORE_LOCK)],
                         stdout=subprocess.PIPE, text=True)
    procs.append(p)
    assert p.stdout is not None and p.stdout.readline() == "held\n"
    os.utime(store, (_OLD, _OLD))
    return p


def test_only_stores_no_live_process_holds_are_swept(tmp_path, holders) -> None:
    shm = str(tmp_path / "shm")
    os.mkdir(shm)
    spills = str(tmp_path / "spill")
    dead_spill, live_spill = _spill_dir(spills, "node-dead"), _spill_dir(spills, "node-live")
    dead = _store(shm, "dead", spill=dead_spill)
    live = _store(shm, "live", spill=live_spill)
    # Dead too, naming a symlink and a directory not named as a spill directory: left alone.
    linked = _store(shm, "dead-link", spill=os.path.join(spills, "node-link"))
    os.symlink(live_spill, os.path.join(spills, "node-link"))
    odd = _store(shm, "dead-odd", spill=_spill_dir(spills, "not-a-spill-dir"))
    frozen = _store(shm, "frozen")
    young = _store(shm, "young", old=False)  # its maker may not have locked it yet
    unlocked = _store(shm, "older-lumos", locked=False)  # no lock file: not ours to judge
    _hold(holders, live)
    os.kill(_hold(holders, frozen).pid, signal.SIGSTOP)  # a frozen raylet is not a dead one
    target = _store(shm, "target")
    os.rename(target, os.path.join(shm, "elsewhere"))
    os.symlink(os.path.join(shm, "elsewhere"), target)  # a symlink named as a store: not followed
    other = None
    if os.geteuid() == 0:
        other = _store(shm, "other-user")
        nobody = pwd.getpwnam("nobody")
        for p in (other, os.path.join(other, node_mod.STORE_LOCK)):
            os.chown(p, nobody.pw_uid, nobody.pw_gid)
        os.utime(other, (_OLD, _OLD))
    not_a_store = os.path.join(shm, "lumos-something-else")
    os.mkdir(not_a_store)
    os.utime(not_a_store, (_OLD, _OLD))

    removed = dict(node_mod.sweep_dead_stores(shm))
    assert set(removed) == {dead, linked, odd} and removed[dead] >= 65536
    assert not os.path.exists(dead) and not os.path.exists(dead_spill)
    for kept in (live, frozen, young, unlocked, target, not_a_store, os.path.join(shm, "elsewhere"), live_spill,
                 os.path.join(spills, "node-link"), os.path.join(spills, "not-a-spill-dir")):
        assert os.path.exists(kept), kept
    assert os.listdir(live_spill)
    assert os.listdir(os.path.join(shm, "elsewhere"))
    if other is not None:
        assert os.path.exists(other)
    # Its holder gone (SIGKILL: no clean-up of its own), a store is swept at the next start.
    holders[0].kill()
    holders[0].wait(10)
    assert [p for p, _ in node_mod.sweep_dead_stores(shm)] == [live]
    assert not os.path.exists(live_spill)


_DRIVER = textwrap.dedent("""
    import lumos
    lumos.init(num_cpus=1, include_dashboard=False)
    ref = lumos.put(b"x" * (4 << 20))
    print(lumos.get_runtime_context().get_node_id(), flush=True)
    import time
    time.sleep(120)
""")


def test_a_store_a_killed_node_left_is_removed_by_the_next_init(fresh_cluster) -> None:
    """A node whose processes are all killed with SIGKILL (as Slurm ends a job step, or
    the OOM killer picks a raylet) leaves its store: nothing of it can remove it. The
    next ``lumos.init`` on the machine does."""
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER], stdout=subprocess.PIPE, text=True)
    try:
        assert driver.stdout is not None
        node_hex = driver.stdout.readline().strip()
        assert node_hex, "the driver did not start"
        (store,) = [os.path.join(node_mod.SHM_DIR, n) for n in os.listdir(node_mod.SHM_DIR)
                    if n.startswith("lumos-session_") and n.endswith("-" + node_hex[:8])]
        with open(os.path.join(store, node_mod.STORE_LOCK)) as f:
            spill = f.read()
        # Frozen first, so that no process of the tree sees another die before its own
        # SIGKILL (the raylet would clean up on its parent-death signal).
        # Until a pass finds no new process: a worker forked as a pass listed the tree is
        # listed by the next (once every process is frozen, nothing forks).
        os.kill(driver.pid, signal.SIGSTOP)
        tree = [driver.pid]
        while True:
            new = [c.pid for c in psutil.Process(driver.pid).children(recursive=True)
                   if c.pid not in tree]
            if not new:
                break
            for pid in new:
                try:
                    os.kill(pid, signal.SIGSTOP)
                except ProcessLookupError:  # (a short-lived one: the fork server's intermediate process)
                    pass
            tree += new
        for pid in tree[1:] + tree[:1]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # (a short-lived one: the fork server's intermediate process)
                pass
        driver.wait(10)
        wait_for(lambda: all(process_gone(pid) for pid in tree), 20)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        driver.stdout.close()  # type: ignore[union-attr]
    assert os.path.isdir(store) and len(os.listdir(store)) > 1, "the dead node's store was not left behind"
    assert os.path.basename(spill) == f"node-{node_hex[:12]}" and os.path.isdir(spill)
    os.utime(store, (_OLD, _OLD))
    fresh_cluster()
    assert not os.path.exists(store) and not os.path.exists(spill)
    assert lumos.get(lumos.put(b"still works")) == b"still works"
