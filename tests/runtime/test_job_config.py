"""init(job_config=...): a Ray program's JobConfig applies, or is refused; never ignored."""

from __future__ import annotations

import os
from typing import Any

import pytest

import lumos


@lumos.remote
def env_of() -> str | None:
    return os.environ.get("JOB_VAR")


def test_init_applies_a_job_configs_runtime_env_and_namespace(fresh_cluster: Any) -> None:
    # Accepted and ignored before: a Ray program's JobConfig(runtime_env=...) lost its
    # variables without a word. init's own runtime_env= and namespace= still win.
    job = lumos.job_config.JobConfig(runtime_env=lumos.runtime_env.RuntimeEnv(env_vars={"JOB_VAR": "jc"}),
                                     ray_namespace="from-job-config", metadata={"who": "test"})
    fresh_cluster(job_config=job)
    assert lumos.get(env_of.remote(), timeout=30) == "jc"
    assert lumos.get_runtime_context().namespace == "from-job-config"
    # Its metadata is the job's row's, in lumos's state API and Ray's.
    me = lumos.get_runtime_context().get_job_id()
    (row,) = [j for j in lumos.state.list_jobs() if j["job_id"] == me]
    assert row["metadata"] == {"who": "test"} and row["driver_pid"] == os.getpid()
    (ray_row,) = lumos.util.state.list_jobs(filters=[("JOB_ID", "=", me)])  # (keys without case, as Ray's)
    assert ray_row.metadata == {"who": "test"} and ray_row.type == "DRIVER"
    # As Ray's rows: times in ms, nested fields as attributes, asdict().
    assert ray_row.start_time == ray_row.start_time_ms == int(row["start_time"] * 1000)
    assert ray_row.driver_info.pid == str(os.getpid()) and ray_row.asdict()["job_id"] == me
    (node,) = lumos.util.state.list_nodes()
    assert node.resources_total["object_store_memory"] == node.object_store_capacity_bytes > 0
    with pytest.raises(ValueError, match="no field 'bogus'"):
        lumos.util.state.list_placement_groups(filters=[("bogus", "=", 1)])
    lumos.shutdown()
    fresh_cluster(job_config=job, runtime_env={"env_vars": {"JOB_VAR": "init"}}, namespace="own")
    assert lumos.get(env_of.remote(), timeout=30) == "init" and lumos.get_runtime_context().namespace == "own"


def test_init_refuses_what_a_job_config_asks_and_lumos_does_not_do() -> None:
    JobConfig = lumos.job_config.JobConfig
    with pytest.raises(NotImplementedError, match="lifetime='detached'"):
        lumos.init(job_config=JobConfig(default_actor_lifetime="detached"))
    with pytest.raises(NotImplementedError, match="code_search_path"):
        lumos.init(job_config=JobConfig(code_search_path=["/opt/code"]))
    with pytest.raises(ValueError, match="default_actor_lifetime"):
        JobConfig(default_actor_lifetime="forever")
    assert not lumos.is_initialized()


def test_metadata_that_is_not_str_to_str_is_refused(fresh_cluster: Any) -> None:
    JobConfig = lumos.job_config.JobConfig
    with pytest.raises(TypeError, match="metadata must map str to str"):
        lumos.init(job_config=JobConfig(metadata={"epochs": 3}))
    with pytest.raises(ValueError, match="at most"):
        lumos.init(job_config=JobConfig(metadata={"big": "x" * 70_000}))
    assert not lumos.is_initialized()
    # A peer sending such a registration gets an error; the GCS goes on.
    from lumos._private import worker_context
    from lumos._private.protocol import messages as m
    fresh_cluster(num_cpus=1, include_dashboard=False)
    cw = worker_context.require()
    with pytest.raises(Exception, match="metadata must map str to str"):
        cw.call_gcs(m.RegisterJob(cw.address, os.getpid(), "ns", "x", metadata={"a": 1}))  # type: ignore[dict-item]
    assert lumos.get(env_of.remote(), timeout=30) is None
