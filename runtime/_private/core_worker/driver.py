"""What a driver tells the cluster about its job and how it shows what the cluster sends back:
the job config it stores in the GCS (``KvPut("job", …)``: cwd, ``sys.path``, namespace,
runtime env) so its workers import the same code, and the default printers for its workers'
output lines and for cluster errors published to it. ``client/worker.py`` uses the same
printers. Imports the standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def job_config(namespace: str, env_vars: dict[str, str] | None = None, working_dir: str | None = None,
               py_modules: list[str] | None = None, setup_hook: dict[str, str] | None = None,
               logging_config: dict[str, Any] | None = None) -> bytes:
    """The job's config as stored in the GCS: where the driver runs and imports from, the
    content hashes of the packages it shipped, its setup hook and its logging config
    (``working_dir.JobCode``)."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    if main_file:
        paths.insert(0, os.path.dirname(os.path.abspath(main_file)))
    return json.dumps({"cwd": os.getcwd(), "sys_path": [os.getcwd()] + paths, "namespace": namespace,
                       "env_vars": env_vars or {}, "working_dir": working_dir,
                       "py_modules": py_modules or [], "setup_hook": setup_hook,
                       "logging_config": logging_config}).encode()


def code_env(working_dir: Any, py_modules: Any) -> dict[str, Any]:
    """A job's working_dir and py_modules packages as ``runtime_context.runtime_env`` names
    them: the URIs of their zips in the GCS (Ray's form, ``gcs://_lumos_pkg_<hash>.zip``)."""
    env: dict[str, Any] = {}
    if working_dir:
        env["working_dir"] = f"gcs://_lumos_pkg_{working_dir}.zip"
    if py_modules and isinstance(py_modules, list):
        env["py_modules"] = [f"gcs://_lumos_pkg_{h}.zip" for h in py_modules]
    return env


def print_worker_lines(lines: list[Any]) -> None:
    """Write workers' output lines to the driver's stdout/stderr, prefixed by task and pid."""
    for rec in lines:
        _job, _task_id, task_name, pid, is_stderr, text = rec[:6]
        stream = sys.stderr if is_stderr else sys.stdout
        prefix = f"({task_name} pid={pid}) " if task_name else f"(pid={pid}) "
        try:
            stream.write("".join(prefix + line + "\n" for line in text.split("\n")))
            stream.flush()
        except (ValueError, OSError):
            pass


def print_cluster_error(kind: str, text: str) -> None:
    """Write an error the cluster published to this driver to its stderr."""
    try:
        sys.stderr.write(f"lumos warning ({kind}): {text}\n")
        sys.stderr.flush()
    except (ValueError, OSError):
        pass
