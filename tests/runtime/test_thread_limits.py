"""runtime_env env_vars that size native thread pools (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS…)
limit numpy's already-loaded BLAS pool in a worker: per task, for an actor's lifetime, per job."""

from __future__ import annotations

import os
from typing import Any

import pytest

import lumos
from lumos._private import thread_limits

ONE = {"env_vars": {"OMP_NUM_THREADS": "1"}}


@lumos.remote
def blas_threads() -> tuple[int, int | None]:
    """(pid, the BLAS pool's size) as threadpoolctl sees it in the worker."""
    return os.getpid(), _local_blas()


@lumos.remote
class Holder:
    def threads(self) -> int | None:
        return _local_blas()


def _local_blas() -> int | None:
    import numpy  # noqa: F401  (a spawned worker loads its BLAS here)
    import threadpoolctl
    sizes = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    return sizes[0] if sizes else None


def _default_or_skip() -> int:
    """The BLAS pool's size in a task that sets nothing; skips where it cannot show a limit."""
    _pid, default = lumos.get(blas_threads.remote(), timeout=60)
    if default is None:
        pytest.skip("numpy's BLAS reports no thread control to threadpoolctl on this machine")
    if default <= 1:
        pytest.skip(f"numpy's BLAS runs {default} thread by default here: a limit of 1 would not show")
    return default


def test_wanted_follows_each_library_precedence() -> None:
    env = {"OMP_NUM_THREADS": "3,2", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "junk"}
    assert thread_limits.wanted("openblas", env) == 1
    assert thread_limits.wanted("mkl", env) == 3  # an invalid value is ignored, as MKL ignores it
    assert thread_limits.wanted("openmp", env) == 3
    assert thread_limits.wanted("blis", {}) is None
    assert thread_limits.wanted("numexpr", {"OMP_NUM_THREADS": "1"}) is None


def test_forked_worker_task_and_actor_limits(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False)
    default = _default_or_skip()
    pids = set()
    for env in (ONE, {"env_vars": {"OPENBLAS_NUM_THREADS": "1"}}):
        pid, n = lumos.get(blas_threads.options(runtime_env=env).remote(), timeout=60)
        assert n == 1, env
        pids.add(pid)
        pid, n = lumos.get(blas_threads.remote(), timeout=60)  # the next task sees the default again
        assert n == default
        pids.add(pid)
    assert len(pids) == 1, "one CPU: every task ran in the same forked worker"
    actor = Holder.options(runtime_env=ONE).remote()
    assert lumos.get([actor.threads.remote() for _ in range(3)], timeout=60) == [1, 1, 1]
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == default


@pytest.mark.slow
def test_spawned_worker_loads_numpy_under_the_limit_and_drops_it(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"worker_start": "spawn"})
    default = _local_blas()  # the driver's: workers inherit its environment
    if default is None or default <= 1:
        pytest.skip(f"numpy's BLAS here has no thread control or runs {default} thread: a limit would not show")
    pid, n = lumos.get(blas_threads.options(runtime_env=ONE).remote(), timeout=60)  # numpy loads in this task
    assert n == 1
    assert lumos.get(blas_threads.options(runtime_env=ONE).remote(), timeout=60)[1] == 1
    pid2, n = lumos.get(blas_threads.remote(), timeout=60)
    assert (pid2, n) == (pid, default)


def test_job_env_limits_every_task_and_a_task_may_raise_it(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False, runtime_env=ONE)
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == 1
    own = lumos.get(blas_threads.options(runtime_env={"env_vars": {"OMP_NUM_THREADS": "2"}}).remote(), timeout=60)
    if own[1] is None:
        pytest.skip("numpy's BLAS reports no thread control to threadpoolctl on this machine")
    assert own[1] == 2
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == 1
