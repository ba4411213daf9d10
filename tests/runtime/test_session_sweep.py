"""Every start makes a session directory (logs, spill files) under this user's root, and
nothing else removes them: a raylet, a few seconds after it starts, removes those of
clusters that ended, all but the newest ``session_dirs_kept`` (``node.sweep_old_sessions``),
and never a live, frozen, young or recorded one, nor anything not named and made as one."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from lumos._private import node as node_mod

from ..conftest import wait_for

pytestmark = pytest.mark.timeout(120)

NOW = time.time()


def _session(root: Path, name: str, age_s: float, sockets: bool = False) -> Path:
    path = root / f"session_{name}"
    (path / "logs").mkdir(parents=True, mode=0o700)
    (path / "logs" / "gcs.log").write_bytes(b"x" * 8192)
    if sockets:
        (path / "sockets").mkdir(mode=0o700)
    for p in (path / "logs", path):
        os.utime(p, (NOW - age_s, NOW - age_s))
    return path


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    r = tmp_path / "root"
    r.mkdir(mode=0o700)
    yield r


def test_only_ended_sessions_beyond_the_newest_are_removed(root: Path) -> None:
    s1 = _session(root, "1", 4000)
    s2 = _session(root, "2", 3000)
    s3 = _session(root, "3", 2000)
    s4 = _session(root, "4", 1000)
    # Killed: its socket files are left, and nothing accepts on them.
    stale = _session(root, "stale", 1500, sockets=True)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(stale / "sockets" / "gcs.sock"))
    dead.close()
    os.utime(stale, (NOW - 1500, NOW - 1500))
    # Alive (or frozen: nobody accepts, the kernel queues): old, yet kept.
    live = _session(root, "live", 5000, sockets=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(live / "sockets" / "raylet-0123.sock"))
    listener.listen(1)
    os.utime(live, (NOW - 5000, NOW - 5000))
    young = _session(root, "young", 5)  # its node may be starting
    named = _session(root, "named", 6000)  # `lumos start --head`'s record names it
    (root / "current_cluster.json").write_text(json.dumps({"session_dir": str(named)}))
    elsewhere = root.parent / "elsewhere"
    elsewhere.mkdir()
    (root / "session_link").symlink_to(elsewhere)
    (root / "session_file").write_text("not a session")
    other = root / "notes"
    other.mkdir()
    os.utime(other, (NOW - 9000, NOW - 9000))
    try:
        removed = node_mod.sweep_old_sessions(str(root), keep=2, now=NOW)
    finally:
        listener.close()
    assert [p for p, _ in removed] == [str(s1), str(s2), str(s3)]  # oldest first
    assert all(size >= 8192 for _, size in removed), removed
    left = sorted(p.name for p in root.iterdir())
    assert left == ["current_cluster.json", "notes", "session_4", "session_file", "session_link",
                    "session_live", "session_named", "session_stale", "session_young"], left
    assert s4.is_dir() and stale.is_dir() and elsewhere.is_dir()


def test_one_sweep_removes_at_most_its_share_the_oldest(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_mod, "SWEEP_MAX_SESSIONS", 2)
    made = [_session(root, str(i), 1000 * (6 - i)) for i in range(6)]  # made[0] the oldest
    assert [p for p, _ in node_mod.sweep_old_sessions(str(root), keep=1, now=NOW)] == [str(made[0]), str(made[1])]
    assert [p for p, _ in node_mod.sweep_old_sessions(str(root), keep=1, now=NOW)] == [str(made[2]), str(made[3])]
    assert [p.name for p in sorted(root.iterdir())] == ["session_4", "session_5"]


def test_zero_keeps_every_session(root: Path) -> None:
    for i in range(3):
        _session(root, str(i), 1000 * (i + 1))
    assert node_mod.sweep_old_sessions(str(root), keep=0, now=NOW) == []
    assert len(list(root.iterdir())) == 3


def test_a_missing_root_removes_nothing(tmp_path: Path) -> None:
    assert node_mod.sweep_old_sessions(str(tmp_path / "none"), keep=1, now=NOW) == []


@pytest.fixture
def short_root() -> Iterator[Path]:
    """A root with a short path (a Unix socket's path is at most 107 bytes)."""
    r = Path(tempfile.mkdtemp(prefix="lumos-sw-", dir="/tmp"))
    try:
        yield r
    finally:
        shutil.rmtree(r, ignore_errors=True)


def test_a_raylet_sweeps_its_root_after_it_starts(fresh_cluster: Any, monkeypatch: pytest.MonkeyPatch,
                                                  short_root: Path) -> None:
    root = short_root
    monkeypatch.setenv("LUMOS_TMPDIR", str(root))
    old = [_session(root, f"old{i}", 1000 * (i + 1)) for i in range(3)]
    ctx = fresh_cluster(num_cpus=1, _system_config={"session_dirs_kept": 1})
    own = Path(ctx.address_info["session_dir"])
    assert own.parent == root
    wait_for(lambda: not old[1].exists() and not old[2].exists(), timeout_s=30)
    assert old[0].is_dir() and own.is_dir()  # the newest ended one, and the live cluster's own
    logs = "".join(p.read_text(errors="replace") for p in (own / "logs").glob("raylet-*.log"))
    assert "removed 2 session directories of clusters that ended" in logs, logs[-2000:]
