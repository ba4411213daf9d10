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
