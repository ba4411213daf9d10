"""Ray's ``ray.runtime_env``: ``RuntimeEnv`` and ``RuntimeEnvConfig``, the typed forms of
a ``runtime_env`` dict.

Both are dicts, as Ray's are, so they go wherever a ``runtime_env`` dict goes
(``init(runtime_env=...)``, ``.options(runtime_env=...)``, ``JobConfig``). They hold what
lumos supports: ``env_vars``, and for a whole job ``working_dir``, ``py_modules`` (local
directories, ``.py`` files, imported modules), ``excludes`` and
``worker_process_setup_hook``. A field lumos cannot honour (``pip``, ``conda``,
``container`` … with something to install) is refused when the object is made, with the
error a dict holding it gets.

    import lumos as ray
    env = ray.runtime_env.RuntimeEnv(env_vars={"OMP_NUM_THREADS": "4"})
    ray.init(runtime_env=env)
"""

from __future__ import annotations

import json
from typing import Any

from lumos.options import env_vars_of


class RuntimeEnvConfig(dict):  # type: ignore[type-arg]
    """Ray's ``RuntimeEnvConfig`` (``runtime_env["config"]``). lumos accepts its fields and
    has nothing to apply: environment variables need no setup to time out or install."""

    def __init__(self, setup_timeout_seconds: int = 600, eager_install: bool = True,
                 log_files: list[str] | None = None) -> None:
        if not isinstance(setup_timeout_seconds, int) or isinstance(setup_timeout_seconds, bool) \
                or (setup_timeout_seconds <= 0 and setup_timeout_seconds != -1):
            raise ValueError(f"setup_timeout_seconds must be a positive int or -1, not {setup_timeout_seconds!r}")
        if not isinstance(eager_install, bool):
            raise TypeError(f"eager_install must be a bool, not {type(eager_install).__name__}")
        super().__init__(setup_timeout_seconds=setup_timeout_seconds, eager_install=eager_install)
        if log_files is not None:
            self["log_files"] = list(log_files)


class RuntimeEnv(dict):  # type: ignore[type-arg]
    """A job's, task's or actor's runtime environment (Ray's ``RuntimeEnv``), checked as it
    is made. Only the fields given are set; ``None`` leaves a field out."""

    def __init__(self, *, py_modules: Any = None, working_dir: str | None = None, pip: Any = None,
                 conda: Any = None, container: Any = None, env_vars: dict[str, str] | None = None,
                 worker_process_setup_hook: Any = None, nsight: Any = None,
                 config: dict[str, Any] | RuntimeEnvConfig | None = None, _validate: bool = True,
                 mpi: Any = None, image_uri: str | None = None, uv: Any = None, **kwargs: Any) -> None:
        super().__init__()
        fields = {"py_modules": py_modules, "working_dir": working_dir, "pip": pip, "conda": conda,
                  "container": container, "env_vars": env_vars,
                  "worker_process_setup_hook": worker_process_setup_hook, "nsight": nsight,
                  "config": config, "mpi": mpi, "image_uri": image_uri, "uv": uv, **kwargs}
        for name, value in fields.items():
            if value is not None:
                self[name] = value
        if _validate:
            env_vars_of(self, job=True)

    def env_vars(self) -> dict[str, str]:
        return dict(self.get("env_vars") or {})

    def working_dir(self) -> str:
        return str(self.get("working_dir") or "")

    def has_working_dir(self) -> bool:
        return bool(self.get("working_dir"))

    def to_dict(self) -> dict[str, Any]:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.items()}

    def serialize(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def deserialize(cls, serialized_runtime_env: str) -> "RuntimeEnv":
        return cls(**json.loads(serialized_runtime_env))


__all__ = ["RuntimeEnv", "RuntimeEnvConfig"]
