"""The keyword-only task spec builder (``lumos._private.task_spec``), without a cluster."""

from __future__ import annotations

import pickle

import pytest

from lumos._private.ids import new_task_id
from lumos._private.protocol import messages as m
from lumos._private.task_spec import new_task_spec, retry_policy_of, task_template

pytestmark = pytest.mark.timeout(30)

OWNER = m.Address(b"n" * 16, b"w" * 16, "/tmp/w.sock", "127.0.0.1", 1234)
JOB = b"\x01" * 4
ROOT = b"\x02" * 16


def _call(template, **extra):
    return new_task_spec(template, task_id=new_task_id(), job_id=JOB, parent_task_id=ROOT, owner=OWNER,
                         args=b"args", **extra)


def test_builders_take_keywords_only():
    with pytest.raises(TypeError):
        task_template(m.TaskKind.NORMAL_TASK, b"f" * 16, "mod.f", "f")  # type: ignore[misc]
    t = task_template(kind=m.TaskKind.NORMAL_TASK, function_id=b"f" * 16, function_name="mod.f", name="f")
    with pytest.raises(TypeError):
        new_task_spec(t, new_task_id(), JOB, ROOT, OWNER, b"")  # type: ignore[misc]


def test_retry_option_maps_to_a_retry_policy():
    assert retry_policy_of(False) == (m.RetryPolicy.NEVER, None)
    assert retry_policy_of(True) == (m.RetryPolicy.ANY_EXCEPTION, None)
    policy, types = retry_policy_of([KeyError, OSError])
    assert policy is m.RetryPolicy.LISTED_EXCEPTIONS and pickle.loads(types) == [KeyError, OSError]


def test_normal_task_spec_carries_its_template_and_round_trips():
    t = task_template(kind=m.TaskKind.NORMAL_TASK, function_id=b"f" * 16, function_name="mod.f", name="f",
                      num_returns=2, resources={"CPU": 1.0}, max_retries=3, retry_exceptions=[ValueError],
                      max_calls=1, enable_task_events=False)
    spec = _call(t, nested_refs=[[b"o" * 20, OWNER]], root_task_id=ROOT, runtime_env={"A": "1"})
    assert (spec.kind, spec.name, spec.function_name, spec.num_returns) == (m.TaskKind.NORMAL_TASK, "f", "mod.f", 2)
    assert (spec.max_retries, spec.retry_exceptions) == (3, m.RetryPolicy.LISTED_EXCEPTIONS)
    assert pickle.loads(spec.retry_exception_types) == [ValueError]
    assert (spec.max_calls, spec.enable_task_events, spec.attempt, spec.actor_id) == (1, False, 0, None)
    assert (spec.owner, spec.parent_task_id, spec.root_task_id, spec.runtime_env) == (OWNER, ROOT, ROOT, {"A": "1"})
    assert spec.deps == [] and spec.nested_refs == [[b"o" * 20, OWNER]]
    back = m.decode(m.encode(m.REQUEST, 1, m.PushTask(spec, {})))[2].spec
    assert back == spec and type(back.kind) is m.TaskKind and type(back.retry_exceptions) is m.RetryPolicy


def test_actor_creation_and_call_specs():
    create = task_template(kind=m.TaskKind.ACTOR_CREATION_TASK, function_id=b"c" * 16, function_name="mod.C",
                           name="C.__init__", resources={"CPU": 0.0})
    spec = _call(create, actor_id=b"a" * 16, actor_options={"name": "x"})
    assert (spec.kind, spec.num_returns, spec.max_retries, spec.actor_options) == (
        m.TaskKind.ACTOR_CREATION_TASK, 1, 0, {"name": "x"})
    call = task_template(kind=m.TaskKind.ACTOR_TASK, function_id=b"", function_name="incr", name="C.incr",
                         max_retries=2)
    spec = _call(call, actor_id=b"a" * 16, sequence_no=5, caller_id=b"w" * 16, actor_options="io")
    assert (spec.kind, spec.function_name, spec.sequence_no, spec.caller_id, spec.actor_options) == (
        m.TaskKind.ACTOR_TASK, "incr", 5, b"w" * 16, "io")
    assert spec.max_calls == 0  # a worker's max_calls never applies to actor calls


def test_builders_refuse_fields_that_do_not_fit_the_kind():
    with pytest.raises(ValueError, match="actor creation returns 1 value"):
        task_template(kind=m.TaskKind.ACTOR_CREATION_TASK, function_id=b"c" * 16, function_name="C",
                      name="C", num_returns=2)
    with pytest.raises(ValueError, match="function_id must be empty"):
        task_template(kind=m.TaskKind.ACTOR_TASK, function_id=b"x", function_name="m", name="C.m")
    call = task_template(kind=m.TaskKind.ACTOR_TASK, function_id=b"", function_name="m", name="C.m")
    with pytest.raises(ValueError, match="ACTOR_TASK needs the actor_id"):
        _call(call)
