"""Ray's ``ray.LoggingConfig``: one logging setup for a job's driver and all its workers.

``init(logging_config=LoggingConfig(...))`` (or ``JobConfig(py_logging_config=...)``)
sets the root logger of the driver at once, and of every worker before it runs the job's
first task: it adds a handler to stderr (a worker's stderr reaches the driver, prefixed by the
task, and its log file) at ``log_level``, each record carrying where it came from (a tab
after the time, as in Ray)::

    2026-12-01 13:02:11,201 INFO train.py:12 -- step done job_id=01000000 worker_id=9f... node_id=3c...
        task_id=a1... task_name=train_step task_func_name=__main__.train_step timestamp_ns=...

``encoding="JSON"`` writes one JSON object per record with the same fields (and
``exc_text`` when it has a traceback). ``additional_log_standard_attrs`` adds standard
``LogRecord`` attributes (``name``, ``funcName``, ``process`` …); fields given with
``logger.info(..., extra={...})`` are always included.

    import logging
    import lumos as ray
    ray.init(logging_config=ray.LoggingConfig(encoding="JSON", log_level="DEBUG"))
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: Every attribute a plain ``LogRecord`` has (and the two ``Formatter`` adds): a record's
#: other attributes came from ``extra=``.
_STANDARD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}
#: What ``_ContextFilter`` adds, in this order.
_CONTEXT = ("job_id", "worker_id", "node_id", "actor_id", "actor_name", "task_id", "task_name", "task_func_name")
_ENCODINGS = ("TEXT", "JSON")


class LoggingConfig:
    """The logging of a job's driver and workers (Ray's ``LoggingConfig``).

    Args:
        encoding: ``"TEXT"`` (a line: time, level, file:line, message, then ``key=value``
            fields) or ``"JSON"`` (an object per line).
        log_level: the root logger's level, a name (``"INFO"``) or a number.
        additional_log_standard_attrs: standard ``LogRecord`` attributes to add to each
            record's fields (``["name", "funcName"]``).

    Raises:
        ValueError: an unknown encoding, level name or record attribute.
    """

    def __init__(self, encoding: str = "TEXT", log_level: str | int = "INFO",
                 additional_log_standard_attrs: list[str] | tuple[str, ...] = ()) -> None:
        if encoding not in _ENCODINGS:
            raise ValueError(f"LoggingConfig encoding must be one of {list(_ENCODINGS)}, not {encoding!r}")
        if isinstance(log_level, bool) or not isinstance(log_level, (str, int)) \
                or (isinstance(log_level, str) and not isinstance(logging.getLevelName(log_level.upper()), int)):
            raise ValueError(f"LoggingConfig log_level must be a logging level name (DEBUG, INFO, WARNING, "
                             f"ERROR, CRITICAL) or a number, not {log_level!r}")
        if isinstance(additional_log_standard_attrs, str) or not all(
                isinstance(a, str) for a in additional_log_standard_attrs):
            raise TypeError("LoggingConfig additional_log_standard_attrs must be a list of attribute names")
        unknown = sorted(set(additional_log_standard_attrs) - _STANDARD_ATTRS)
        if unknown:
            raise ValueError(f"LoggingConfig additional_log_standard_attrs {unknown} are not LogRecord "
                             f"attributes; they are among {sorted(_STANDARD_ATTRS)}")
        self.encoding = encoding
        self.log_level: str | int = log_level.upper() if isinstance(log_level, str) else log_level
        self.additional_log_standard_attrs = list(additional_log_standard_attrs)

    def __repr__(self) -> str:
        return (f"LoggingConfig(encoding={self.encoding!r}, log_level={self.log_level!r}, "
                f"additional_log_standard_attrs={self.additional_log_standard_attrs!r})")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LoggingConfig) and self.to_dict() == other.to_dict()

    def to_dict(self) -> dict[str, Any]:
        """As the job's config carries it to the workers."""
        return {"encoding": self.encoding, "log_level": self.log_level,
                "additional_log_standard_attrs": list(self.additional_log_standard_attrs)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LoggingConfig:
        return cls(d.get("encoding", "TEXT"), d.get("log_level", "INFO"), d.get("additional_log_standard_attrs", ()))

    def _apply(self) -> None:
        """Make this process's root logger log this way: its handler is added beside the
        ones it has (as Ray adds it), in place of one an earlier config added."""
        handler = _Handler(sys.stderr)
        handler.setLevel(self.log_level)
        handler.setFormatter((_JsonFormatter if self.encoding == "JSON" else _TextFormatter)(
            self.additional_log_standard_attrs))
        handler.addFilter(_ContextFilter())
        root = logging.getLogger()
        for old in root.handlers[:]:
            if isinstance(old, _Handler):
                root.removeHandler(old)
        root.addHandler(handler)
        root.setLevel(self.log_level)


class _Handler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler a ``LoggingConfig`` adds (told apart from the process's own)."""


def logging_config_of(value: Any) -> LoggingConfig | None:
    """``init``'s ``logging_config`` (or a job config's ``py_logging_config``), checked."""
    if value is None or isinstance(value, LoggingConfig):
        return value
    # Ray's own LoggingConfig (a dataclass with the same fields) is taken by its fields.
    fields = ("encoding", "log_level", "additional_log_standard_attrs")
    if all(hasattr(value, f) for f in fields):
        return LoggingConfig(*(getattr(value, f) for f in fields))
    raise TypeError(f"logging_config must be a lumos.LoggingConfig, not {type(value).__name__}")


class _ContextFilter(logging.Filter):
    """Adds the job, worker, node, actor and task a record was logged in (where known)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from lumos._private import worker_context
        cw = worker_context.core_worker
        if cw is None:
            return True
        try:
            from lumos.runtime_context import RuntimeContext
            ctx = RuntimeContext()
            values = {"job_id": cw.job_id.hex() if cw.job_id else None, "worker_id": cw.worker_id.hex(),
                      "node_id": cw.node_id.hex() if cw.node_id else None}
            if worker_context.is_worker:
                values.update(actor_id=ctx.get_actor_id(), actor_name=ctx.get_actor_name() or None,
                              task_id=ctx.get_task_id(), task_name=ctx.get_task_name(),
                              task_func_name=ctx.get_task_function_name())
        except Exception:  # (a record logged mid-shutdown, say: logged without the context)
            return True
        for key, value in values.items():
            if value and not hasattr(record, key):
                setattr(record, key, value)
        return True


class _Fields(logging.Formatter):
    def __init__(self, additional: list[str]) -> None:
        super().__init__()
        self.additional = additional

    def fields(self, record: logging.LogRecord) -> dict[str, Any]:
        """A record's fields past its message: the standard ones asked for, ``extra=``
        ones, the context, then the time in nanoseconds."""
        out = {a: getattr(record, a, None) for a in self.additional}
        out.update((k, v) for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS and k not in _CONTEXT)
        out.update((k, getattr(record, k)) for k in _CONTEXT if hasattr(record, k))
        out["timestamp_ns"] = int(record.created * 1e9) if record.created else time.time_ns()
        return out


class _TextFormatter(_Fields):
    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        line = (f"{self.formatTime(record)}\t{record.levelname} {record.filename}:{record.lineno} -- "
                f"{record.message} " + " ".join(f"{k}={v}" for k, v in self.fields(record).items()))
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        return f"{line}\n{record.exc_text}" if record.exc_text else line


class _JsonFormatter(_Fields):
    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        out: dict[str, Any] = {"asctime": self.formatTime(record), "levelname": record.levelname,
                               "message": record.message, "filename": record.filename, "lineno": record.lineno}
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc_text"] = record.exc_text
        out.update(self.fields(record))
        return json.dumps(out, default=str)


__all__ = ["LoggingConfig"]
