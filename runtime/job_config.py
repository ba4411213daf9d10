"""Ray's ``ray.job_config.JobConfig``, for ``init(job_config=...)``.

What lumos applies from a job config (its own or Ray's, read by attribute): the
``runtime_env``, the ``ray_namespace`` and the ``py_logging_config``, unless ``init`` is
given its own ``runtime_env=``, ``namespace=`` or ``logging_config=`` (those win, as in
Ray), and the ``metadata``, which
the job's row carries (``list_jobs``). A job config asking for what lumos does not do
(every actor detached by default, Java options, a code search path) is refused by
``init``, not ignored.
"""

from __future__ import annotations

from typing import Any

from lumos.runtime_env import RuntimeEnv

_LIFETIMES = ("non_detached", "detached")


class JobConfig:
    """A job's configuration (Ray's ``JobConfig``)."""

    def __init__(self, jvm_options: list[str] | None = None, code_search_path: list[str] | None = None,
                 runtime_env: dict[str, Any] | None = None, _client_job: bool = False,
                 metadata: dict[str, str] | None = None, ray_namespace: str | None = None,
                 default_actor_lifetime: str = "non_detached", py_logging_config: Any = None,
                 **_private: Any) -> None:
        if code_search_path is not None and not isinstance(code_search_path, (list, tuple)):
            raise TypeError(f"code_search_path must be a list, not {type(code_search_path).__name__}")
        self.jvm_options = list(jvm_options or [])
        self.code_search_path = list(code_search_path or [])
        self.metadata: dict[str, str] = dict(metadata or {})
        self.ray_namespace = ray_namespace
        self.set_runtime_env(runtime_env)
        self.set_default_actor_lifetime(default_actor_lifetime)
        self.set_py_logging_config(py_logging_config)

    def set_py_logging_config(self, logging_config: Any = None) -> None:
        """The job's ``LoggingConfig`` (``init``'s ``logging_config=`` wins over it)."""
        from lumos.logging_config import logging_config_of
        self.py_logging_config = logging_config_of(logging_config)

    def set_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    def set_runtime_env(self, runtime_env: dict[str, Any] | RuntimeEnv | None, validate: bool = False) -> None:
        self.runtime_env: dict[str, Any] = dict(runtime_env) if runtime_env is not None else {}
        if validate:
            RuntimeEnv(**self.runtime_env)

    def set_ray_namespace(self, ray_namespace: str) -> None:
        self.ray_namespace = ray_namespace

    def set_default_actor_lifetime(self, default_actor_lifetime: str) -> None:
        if default_actor_lifetime not in _LIFETIMES:
            raise ValueError(f"default_actor_lifetime must be one of {list(_LIFETIMES)}, "
                             f"not {default_actor_lifetime!r}")
        self.default_actor_lifetime = default_actor_lifetime

    def __repr__(self) -> str:
        return (f"JobConfig(runtime_env={self.runtime_env!r}, ray_namespace={self.ray_namespace!r}, "
                f"metadata={self.metadata!r})")


def applied(job_config: Any, runtime_env: dict[str, Any] | None,
            namespace: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """``init``'s runtime_env and namespace once ``job_config`` (lumos's or Ray's) is taken
    into account; raises for what lumos would otherwise silently not do."""
    if job_config is None:
        return runtime_env, namespace
    lifetime = getattr(job_config, "default_actor_lifetime", None)
    if lifetime is None:  # Ray's JobConfig keeps it as its protobuf enum: DETACHED 0, NON_DETACHED 1
        lifetime = "detached" if getattr(job_config, "_default_actor_lifetime", 1) == 0 else "non_detached"
    if lifetime != "non_detached":
        raise NotImplementedError("JobConfig(default_actor_lifetime='detached') is not implemented in "
                                  "lumos; create the actors that must outlive the job with "
                                  ".options(lifetime='detached')")
    for name, instead in (("jvm_options", "lumos runs Python workers only"),
                          ("code_search_path", "ship Python code with runtime_env={'working_dir': ...}")):
        if getattr(job_config, name, None):
            raise NotImplementedError(f"JobConfig({name}=...) is not implemented in lumos; {instead}")
    if runtime_env is None:
        runtime_env = dict(getattr(job_config, "runtime_env", None) or {}) or None
    if namespace is None:
        namespace = getattr(job_config, "ray_namespace", None)
    return runtime_env, namespace


def metadata_of(job_config: Any) -> dict[str, str] | None:
    """A job config's ``metadata`` (lumos's or Ray's), checked: str -> str; None: none."""
    metadata = getattr(job_config, "metadata", None) if job_config is not None else None
    if not metadata:
        return None
    from lumos._private.protocol.messages import check_job_metadata
    check_job_metadata(metadata)
    return {str(k): str(v) for k, v in metadata.items()}


__all__ = ["JobConfig"]
