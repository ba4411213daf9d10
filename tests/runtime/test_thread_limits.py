"""Native thread pools in workers: one BLAS thread per worker unless the user set
``OMP_NUM_THREADS`` (as Ray), as many as a task's or actor's whole CPUs, and runtime_env
env_vars that size the pools (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS…) applied to numpy's
already-loaded BLAS pool: per task, for an actor's lifetime, per job."""

from __future__ import annotations

import os
from typing import Any

import pytest

import lumos
from lumos._private import thread_limits

ONE = {"env_vars": {"OMP_NUM_THREADS": "1"}}
TWO = {"env_vars": {"OMP_NUM_THREADS": "2"}}


@lumos.remote
def blas_threads() -> tuple[int, int | None]:
    """(pid, the BLAS pool's size) as threadpoolctl sees it in the worker."""
    return os.getpid(), _local_blas()


@lumos.remote
def omp_and_blas() -> tuple[str | None, int | None]:
    return os.environ.get("OMP_NUM_THREADS"), _local_blas()


@lumos.remote
class Holder:
    def threads(self) -> int | None:
        return _local_blas()


def _local_blas() -> int | None:
    import numpy  # noqa: F401  (a spawned worker loads its BLAS here)
    import threadpoolctl
    sizes = [p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas"]
    return sizes[0] if sizes else None


def _controllable_or_skip() -> None:
    """Skips where numpy's BLAS reports no thread control to threadpoolctl, or the
    machine has one CPU (a pool of 2 would not show)."""
    if _local_blas() is None:
        pytest.skip("numpy's BLAS reports no thread control to threadpoolctl on this machine")
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: a pool larger than one thread would not show")


def test_wanted_follows_each_library_precedence() -> None:
    env = {"OMP_NUM_THREADS": "3,2", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "junk"}
    assert thread_limits.wanted("openblas", env) == 1
    assert thread_limits.wanted("mkl", env) == 3  # an invalid value is ignored, as MKL ignores it
    assert thread_limits.wanted("openmp", env) == 3
    assert thread_limits.wanted("blis", {}) is None
    assert thread_limits.wanted("numexpr", {"OMP_NUM_THREADS": "1"}) is None


def test_a_worker_runs_one_blas_thread_and_a_task_as_many_as_its_cpus(fresh_cluster: Any) -> None:
    """As in Ray: a worker's OMP_NUM_THREADS is 1 unless the user set it (each of a node's
    workers ran a pool of as many threads as the node's CPUs, all on those CPUs), a task
    or actor asking for N whole CPUs runs N threads, and the next task one again."""
    _controllable_or_skip()
    fresh_cluster(num_cpus=2, include_dashboard=False)
    assert lumos.get(omp_and_blas.remote(), timeout=60) == ("1", 1)
    assert lumos.get(omp_and_blas.options(num_cpus=2).remote(), timeout=60) == ("2", 2)
    assert lumos.get(omp_and_blas.options(num_cpus=1.5).remote(), timeout=60) == ("1", 1)
    assert lumos.get([omp_and_blas.remote() for _ in range(4)], timeout=60) == [("1", 1)] * 4
    assert lumos.get(Holder.remote().threads.remote(), timeout=60) == 1
    wide = Holder.options(num_cpus=2).remote()
    assert lumos.get([wide.threads.remote() for _ in range(3)], timeout=60) == [2, 2, 2]


def test_the_users_omp_num_threads_stands(fresh_cluster: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _controllable_or_skip()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the node's processes inherit the driver's environment
    fresh_cluster(num_cpus=2, include_dashboard=False)
    assert lumos.get([omp_and_blas.remote() for _ in range(2)], timeout=60) == [("2", 2)] * 2


def test_forked_worker_task_and_actor_limits(fresh_cluster: Any) -> None:
    _controllable_or_skip()
    fresh_cluster(num_cpus=1, include_dashboard=False)
    pids = set()
    for env in (TWO, {"env_vars": {"OPENBLAS_NUM_THREADS": "2"}}):
        pid, n = lumos.get(blas_threads.options(runtime_env=env).remote(), timeout=60)
        assert n == 2, env
        pids.add(pid)
        pid, n = lumos.get(blas_threads.remote(), timeout=60)  # the next task sees the default again
        assert n == 1
        pids.add(pid)
    assert len(pids) == 1, "one CPU: every task ran in the same forked worker"
    actor = Holder.options(runtime_env=TWO).remote()
    assert lumos.get([actor.threads.remote() for _ in range(3)], timeout=60) == [2, 2, 2]
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == 1


@pytest.mark.slow
def test_spawned_worker_loads_numpy_under_the_limit_and_drops_it(fresh_cluster: Any) -> None:
    _controllable_or_skip()
    fresh_cluster(num_cpus=1, include_dashboard=False, _system_config={"worker_start": "spawn"})
    pid, n = lumos.get(blas_threads.options(runtime_env=TWO).remote(), timeout=60)  # numpy loads in this task
    assert n == 2
    assert lumos.get(blas_threads.options(runtime_env=TWO).remote(), timeout=60)[1] == 2
    pid2, n = lumos.get(blas_threads.remote(), timeout=60)
    assert (pid2, n) == (pid, 1)


def test_job_env_limits_every_task_and_a_task_may_raise_it(fresh_cluster: Any) -> None:
    fresh_cluster(num_cpus=1, include_dashboard=False, runtime_env=ONE)
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == 1
    own = lumos.get(blas_threads.options(runtime_env={"env_vars": {"OMP_NUM_THREADS": "2"}}).remote(), timeout=60)
    if own[1] is None:
        pytest.skip("numpy's BLAS reports no thread control to threadpoolctl on this machine")
    assert own[1] == 2
    assert lumos.get(blas_threads.remote(), timeout=60)[1] == 1
