"""Shared fixtures: clusters that are always shut down, and leak checks.

Every cluster fixture tears down in ``finally`` and then checks that no lumos process,
Unix socket or /dev/shm store directory it started is left; a leak fails the test.
"""

from __future__ import annotations

import glob
import os
import time
from typing import Any, Callable, Iterator

import psutil
import pytest

import lumos

#: Short timeouts and invariant checks for every test cluster.
TEST_CONFIG: dict[str, Any] = {
    "validate": True,
    "heartbeat_interval_ms": 200,
    "node_death_timeout_ms": 3000,
    "worker_idle_timeout_s": 5.0,
    "object_store_full_timeout_s": 2.0,
}


def process_gone(pid: int) -> bool:
    """The process has exited (a zombie counts: it runs no more); safe against it
    exiting while we look."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lumos_children() -> list[psutil.Process]:
    """lumos processes started (directly or not) by this test process."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if "lumos._private" in cmd or "-m lumos.dashboard" in cmd:
            out.append(p)
    return out


def wait_for(predicate: Callable[[], Any], timeout_s: float = 10.0, interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s: {predicate}")
        time.sleep(interval_s)


def check_no_leaks(session_dir: str | None, timeout_s: float = 10.0) -> None:
    def clean() -> bool:
        return not lumos_children()
    try:
        wait_for(clean, timeout_s)
    except AssertionError:
        left = [(p.pid, " ".join(p.cmdline())[:120]) for p in lumos_children()]
        for p in lumos_children():
            p.kill()
        raise AssertionError(f"lumos processes left behind: {left}") from None
    if session_dir:
        base = os.path.basename(session_dir)
        stores = glob.glob(f"/dev/shm/lumos-{base}-*")
        assert not stores, f"object store directories left behind: {stores}"
        socks = glob.glob(os.path.join(session_dir, "sockets", "*"))
        assert not socks, f"socket files left behind: {socks}"


def start(**kwargs: Any) -> lumos.LumosContext:
    config = dict(TEST_CONFIG)
    config.update(kwargs.pop("_system_config", {}))
    kwargs.setdefault("num_cpus", 2)
    kwargs.setdefault("object_store_memory", 1024 * 1024 * 1024)
    return lumos.init(_system_config=config, **kwargs)


def running_cluster(**kwargs: Any) -> Iterator[lumos.LumosContext]:
    """Body of a cluster fixture: ``start(**kwargs)``, then shut down and check for leaks."""
    ctx = start(**kwargs)
    session = ctx.address_info["session_dir"]
    try:
        yield ctx
    finally:
        lumos.shutdown()
        check_no_leaks(session)


@pytest.fixture(scope="module")
def cluster() -> Iterator[lumos.LumosContext]:
    """A shared 2-CPU cluster for tests that do not break things."""
    yield from running_cluster()


@pytest.fixture
def fresh_cluster() -> Iterator[Callable[..., lumos.LumosContext]]:
    """Start a cluster with the given init() arguments; shut down after the test."""
    sessions: list[str] = []

    def make(**kwargs: Any) -> lumos.LumosContext:
        ctx = start(**kwargs)
        sessions.append(ctx.address_info["session_dir"])
        return ctx

    try:
        yield make
    finally:
        lumos.shutdown()
        for s in sessions:
            check_no_leaks(s)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test or fixture shows the tails of its cluster's GCS and raylet logs, so a
    failure seen only in CI can be read from CI's output."""
    report = yield
    if report.failed:
        from lumos._private import worker_context
        ctx = worker_context.context
        session = getattr(ctx, "address_info", {}).get("session_dir") if ctx is not None else None
        if session:
            for path in sorted(glob.glob(os.path.join(session, "logs", "gcs*.log")) +
                               glob.glob(os.path.join(session, "logs", "raylet*.log")))[:4]:
                try:
                    with open(path, errors="replace") as f:
                        tail = f.readlines()[-25:]
                except OSError:
                    continue
                report.sections.append((f"lumos log {os.path.basename(path)} (last lines)", "".join(tail)))
    return report
