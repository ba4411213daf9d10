"""runtime_env={"env_vars": ...}: the job's, a task's and an actor's environment variables."""

from __future__ import annotations

import os
import subprocess
from typing import Any, Iterator

import pytest

import lumos
from tests.conftest import running_cluster

NAMES = ("JOB_VAR", "SHARED", "TASK_VAR", "PARENT")


@pytest.fixture(scope="module")
def job_env_cluster() -> Iterator[lumos.LumosContext]:
    yield from running_cluster(runtime_env={"env_vars": {"JOB_VAR": "job", "SHARED": "job"}})


@lumos.remote
def env_of() -> tuple[int, dict[str, str | None]]:
    return os.getpid(), {k: os.environ.get(k) for k in NAMES}


@lumos.remote(runtime_env={"env_vars": {"SHARED": "task", "TASK_VAR": "t"}})
def env_of_own() -> tuple[int, dict[str, str | None]]:
    return os.getpid(), {k: os.environ.get(k) for k in NAMES}


def test_tasks_see_the_job_env_and_their_own_over_it(job_env_cluster: Any) -> None:
    _pid, env = lumos.get(env_of.remote(), timeout=30)
    assert env == {"JOB_VAR": "job", "SHARED": "job", "TASK_VAR": None, "PARENT": None}
    _pid, env = lumos.get(env_of_own.remote(), timeout=30)
    assert env == {"JOB_VAR": "job", "SHARED": "task", "TASK_VAR": "t", "PARENT": None}
    _pid, env = lumos.get(env_of.options(runtime_env={"env_vars": {"TASK_VAR": "opt"}}).remote(), timeout=30)
    assert env["TASK_VAR"] == "opt" and env["SHARED"] == "job"
    assert "TASK_VAR" not in os.environ and "JOB_VAR" not in os.environ  # the driver's own is untouched


def test_a_worker_drops_a_task_env_before_its_next_task(job_env_cluster: Any) -> None:
    with_env = env_of.options(runtime_env={"env_vars": {"TASK_VAR": "t"}})  # same function: same workers
    own_pids = {pid for pid, _ in lumos.get([with_env.remote() for _ in range(6)], timeout=30)}
    after = lumos.get([env_of.remote() for _ in range(30)], timeout=30)
    assert own_pids & {pid for pid, _ in after}, "the pool should reuse a worker"
    assert all(env["TASK_VAR"] is None and env["SHARED"] == "job" for _, env in after), after


def test_children_inherit_their_parent_task_env(job_env_cluster: Any) -> None:
    @lumos.remote(runtime_env={"env_vars": {"PARENT": "p"}})
    def parent() -> tuple[Any, Any, dict[str, Any]]:
        plain = lumos.get(env_of.remote())[1]
        overridden = lumos.get(env_of.options(runtime_env={"env_vars": {"PARENT": "c"}}).remote())[1]
        return plain, overridden, lumos.get_runtime_context().runtime_env

    plain, overridden, context = lumos.get(parent.remote(), timeout=60)
    assert plain["PARENT"] == "p" and plain["JOB_VAR"] == "job"
    assert overridden["PARENT"] == "c"
    assert context == {"env_vars": {"JOB_VAR": "job", "SHARED": "job", "PARENT": "p"}}


def test_an_actor_keeps_its_env_and_its_subprocesses_see_it(job_env_cluster: Any) -> None:
    @lumos.remote(runtime_env={"env_vars": {"TASK_VAR": "actor"}})
    class Tool:
        def __init__(self) -> None:
            self.at_init = os.environ.get("TASK_VAR")

        def shell(self) -> tuple[str | None, str]:
            out = subprocess.run(["sh", "-c", "echo $TASK_VAR-$JOB_VAR"], capture_output=True, text=True)
            return self.at_init, out.stdout.strip()

    tool = Tool.remote()
    for _ in range(3):  # also on later calls: the actor's process keeps it
        assert lumos.get(tool.shell.remote(), timeout=30) == ("actor", "actor-job")
    assert lumos.get_runtime_context().runtime_env == {"env_vars": {"JOB_VAR": "job", "SHARED": "job"}}


def test_bad_runtime_env_is_refused_clearly(job_env_cluster: Any) -> None:
    def f() -> None:
        return None

    with pytest.raises(TypeError, match="str -> str"):
        lumos.remote(runtime_env={"env_vars": {"A": 1}})(f)
    with pytest.raises(ValueError, match="not supported"):
        lumos.remote(runtime_env={"pip": ["numpy"]})(f)
    with pytest.raises(TypeError, match="must be a dict"):
        env_of.options(runtime_env="A=1")
    with pytest.raises(ValueError, match="'='"):
        env_of.options(runtime_env={"env_vars": {"A=B": "1"}})



def test_a_runtime_env_object_is_a_checked_runtime_env_dict(job_env_cluster: Any) -> None:
    # Ray's typed form: a dict, so it goes wherever a runtime_env dict goes.
    env = lumos.runtime_env.RuntimeEnv(env_vars={"TASK_VAR": "typed"})
    assert env == {"env_vars": {"TASK_VAR": "typed"}} and env.env_vars() == {"TASK_VAR": "typed"}
    assert lumos.runtime_env.RuntimeEnv.deserialize(env.serialize()) == env
    _, seen = lumos.get(env_of.options(runtime_env=env).remote(), timeout=30)
    assert seen["TASK_VAR"] == "typed" and seen["JOB_VAR"] == "job"
    config = lumos.runtime_env.RuntimeEnvConfig(setup_timeout_seconds=30)
    assert lumos.runtime_env.RuntimeEnv(env_vars={"A": "1"}, config=config)["config"]["setup_timeout_seconds"] == 30
    # What lumos cannot honour is refused as the object is made, as the dict would be.
    with pytest.raises(ValueError, match=r"\['pip'\] are not supported"):
        lumos.runtime_env.RuntimeEnv(pip=["requests"])
    with pytest.raises(TypeError, match="str -> str"):
        lumos.runtime_env.RuntimeEnv(env_vars={"A": 1})
    with pytest.raises(ValueError, match="setup_timeout_seconds"):
        lumos.runtime_env.RuntimeEnvConfig(setup_timeout_seconds=0)

