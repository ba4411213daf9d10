"""Workers copy large buffers with non-temporal stores (``worker_nontemporal_copy_bytes``):
glibc's tunable is in the environment each worker (or its fork server) was exec'd with,
and the environment its tasks see, and pass on to their subprocesses, is the user's."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any, Callable

import pytest

import lumos
from lumos._private import process

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() != "x86_64",
                                 reason="glibc's non-temporal threshold is an x86-64 tunable")]

TUNABLE = "glibc.cpu.x86_non_temporal_threshold"


@lumos.remote
def environment() -> dict[str, Any]:
    import subprocess
    # What this process (or the fork server it was forked from) was exec'd with: what its
    # C library read its tunables from when it started (glibc 2.36 ends each tunable it
    # reads with a NUL there, in place, so the setting is looked for as a substring).
    with open("/proc/self/environ", "rb") as f:
        at_exec = f.read().decode(errors="replace")
    child = subprocess.run([sys.executable, "-c", "import os; print(repr(os.environ.get('GLIBC_TUNABLES')))"],
                           capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return {"at_exec": at_exec,
            "now": os.environ.get("GLIBC_TUNABLES"), "carrier": "LUMOS_USER_GLIBC_TUNABLES" in os.environ,
            "child": child}


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_worker_is_started_with_the_threshold_and_gives_its_tasks_the_users_environment(
        fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch, start: str) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    fresh_cluster(_system_config={"worker_start": start})
    got = lumos.get(environment.remote(), timeout=60)
    assert f"\0GLIBC_TUNABLES={TUNABLE}={1024 * 1024}\0" in "\0" + got["at_exec"], got
    assert got["now"] is None and not got["carrier"], got
    assert got["child"] == "None", got


def test_the_users_other_tunables_are_kept(fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.tcache_count=7")
    fresh_cluster(_system_config={"worker_nontemporal_copy_bytes": 4 << 20})
    got = lumos.get(environment.remote(), timeout=60)
    assert "\0GLIBC_TUNABLES=glibc.malloc.tcache_count=7" in "\0" + got["at_exec"], got
    assert f"{TUNABLE}={4 << 20}\0" in got["at_exec"], got
    assert got["now"] == "glibc.malloc.tcache_count=7" and not got["carrier"], got
    assert got["child"] == repr("glibc.malloc.tcache_count=7"), got


def test_the_users_own_threshold_stands(fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GLIBC_TUNABLES", f"{TUNABLE}=200000000")
    fresh_cluster()
    got = lumos.get(environment.remote(), timeout=60)
    assert f"\0GLIBC_TUNABLES={TUNABLE}=200000000\0" in "\0" + got["at_exec"], got
    assert got["at_exec"].count(TUNABLE) == 1 and got["now"] == f"{TUNABLE}=200000000", got


def test_zero_leaves_glibcs_choice(fresh_cluster: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    fresh_cluster(_system_config={"worker_nontemporal_copy_bytes": 0})
    got = lumos.get(environment.remote(), timeout=60)
    assert TUNABLE not in got["at_exec"] and got["now"] is None, got


def test_restore_puts_back_an_empty_setting_and_a_missing_one(monkeypatch: pytest.MonkeyPatch) -> None:
    for user in ("", None):
        if user is None:
            monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
        else:
            monkeypatch.setenv("GLIBC_TUNABLES", user)
        env = process.worker_exec_env(1 << 20)
        assert env is not None and env["GLIBC_TUNABLES"] == f"{TUNABLE}={1 << 20}"
        monkeypatch.setattr(os, "environ", dict(env))
        process.restore_user_env()
        assert os.environ.get("GLIBC_TUNABLES") == user and "LUMOS_USER_GLIBC_TUNABLES" not in os.environ
        process.restore_user_env()  # a second time (a forked worker's): nothing to do
        assert os.environ.get("GLIBC_TUNABLES") == user
        monkeypatch.undo()


def test_glibc_takes_the_setting() -> None:
    """The dynamic loader lists the threshold it reads from the environment a worker gets."""
    import glob
    import subprocess
    loaders = sorted(glob.glob("/lib64/ld-linux-x86-64.so.*") + glob.glob("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.*"))
    if not loaders:
        pytest.skip("no glibc dynamic loader")
    env = process.worker_exec_env(3 << 20)
    assert env is not None
    out = subprocess.run([loaders[0], "--list-tunables"], env=env, capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        pytest.skip(f"this glibc cannot list its tunables: {out.stderr.strip()}")
    line = next(x for x in out.stdout.splitlines() if x.startswith(TUNABLE + ":"))
    assert line.split()[1] == hex(3 << 20), line
