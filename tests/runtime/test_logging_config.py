"""init(logging_config=LoggingConfig(...)): the root logger of the driver and its workers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import pytest

import lumos
from lumos.logging_config import LoggingConfig
from tests.conftest import TEST_CONFIG

_DRIVER = textwrap.dedent("""
    import json, logging, sys
    import lumos
    config = lumos.job_config.JobConfig(py_logging_config=lumos.LoggingConfig(
        encoding=sys.argv[2], log_level="INFO", additional_log_standard_attrs=["name"]))
    lumos.init(num_cpus=1, include_dashboard=False, _system_config=json.loads(sys.argv[1]), job_config=config)
    logging.getLogger("drv").info("driver-line")

    @lumos.remote
    def work():
        logging.getLogger("app").info("task-line", extra={"step": 3})
        logging.getLogger("app").debug("debug-line below the level")
        try:
            1 / 0
        except ZeroDivisionError:
            logging.getLogger("app").exception("failed-line")
        return lumos.get_runtime_context().get_task_id()

    @lumos.remote
    class Talker:
        def talk(self):
            logging.getLogger("act").warning("actor-line")
            return lumos.get_runtime_context().get_actor_id()

    print("IDS", json.dumps([lumos.get(work.remote()), lumos.get(Talker.options(name="talker").remote().talk.remote()),
                             lumos.get_runtime_context().get_job_id()]), flush=True)
    lumos.shutdown()
""")


def _run(encoding: str) -> tuple[list[str], str, str, str]:
    out = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(TEST_CONFIG), encoding],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0, out.stderr
    ids = next(line for line in out.stdout.splitlines() if line.startswith("IDS "))
    task_id, actor_id, job_id = json.loads(ids[4:])
    return (out.stdout + out.stderr).splitlines(), task_id, actor_id, job_id


@pytest.mark.timeout(120)
def test_text_records_of_driver_tasks_and_actors_carry_their_context() -> None:
    lines, task_id, actor_id, job_id = _run("TEXT")
    driver = next(line for line in lines if "driver-line" in line)
    assert "\tINFO " in driver and " -- driver-line name=drv " in driver and f"job_id={job_id}" in driver
    assert "task_id=" not in driver
    task = next(line for line in lines if "task-line" in line)
    assert task.startswith("(work pid=") and " -- task-line name=app step=3 " in task
    assert f"task_id={task_id}" in task and "task_name=work" in task and f"job_id={job_id}" in task
    assert "timestamp_ns=" in task and "worker_id=" in task and "node_id=" in task
    failed = next(i for i, line in enumerate(lines) if "failed-line" in line)
    assert any("ZeroDivisionError" in line for line in lines[failed:failed + 8])  # the traceback follows
    actor = next(line for line in lines if "actor-line" in line)
    assert "WARNING" in actor and f"actor_id={actor_id}" in actor and "actor_name=talker" in actor
    assert not [line for line in lines if "debug-line" in line]


@pytest.mark.timeout(120)
def test_json_records_are_one_object_per_line() -> None:
    lines, task_id, actor_id, job_id = _run("JSON")

    def record(marker: str) -> dict:
        line = next(line for line in lines if marker in line)
        return json.loads(line[line.index("{"):])
    task = record("task-line")
    assert task["message"] == "task-line" and task["levelname"] == "INFO" and task["name"] == "app"
    assert task["step"] == 3 and task["task_id"] == task_id and task["job_id"] == job_id
    assert task["task_func_name"].endswith("work") and isinstance(task["timestamp_ns"], int)
    assert "ZeroDivisionError" in record("failed-line")["exc_text"]
    assert record("actor-line")["actor_id"] == actor_id
    assert "task_id" not in record("driver-line")


def test_logging_config_checks_its_fields_and_round_trips() -> None:
    cfg = LoggingConfig("JSON", "debug", ["name", "funcName"])
    assert cfg.log_level == "DEBUG" and LoggingConfig.from_dict(cfg.to_dict()) == cfg
    assert lumos.LoggingConfig is LoggingConfig and "LoggingConfig(encoding='JSON'" in repr(cfg)
    with pytest.raises(ValueError, match="encoding must be one of"):
        LoggingConfig(encoding="XML")
    with pytest.raises(ValueError, match="log_level must be a logging level name"):
        LoggingConfig(log_level="LOUD")
    with pytest.raises(ValueError, match=r"\['nmae'\] are not LogRecord attributes"):
        LoggingConfig(additional_log_standard_attrs=["nmae"])
    with pytest.raises(TypeError, match="must be a lumos.LoggingConfig"):
        lumos.init(logging_config={"encoding": "JSON"})
    assert not lumos.is_initialized()
    assert LoggingConfig(log_level=logging.WARNING).log_level == logging.WARNING


def test_applying_adds_one_handler_beside_the_process_own() -> None:
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    own = logging.NullHandler()
    root.addHandler(own)
    try:
        LoggingConfig("TEXT", "WARNING")._apply()
        LoggingConfig("JSON", "DEBUG")._apply()  # a second init: replaces the first one's handler only
        ours = [h for h in root.handlers if h not in saved and h is not own]
        assert len(ours) == 1 and own in root.handlers and root.level == logging.DEBUG
        assert type(ours[0].formatter).__name__ == "_JsonFormatter"
    finally:
        root.handlers[:] = saved
        root.setLevel(level)
