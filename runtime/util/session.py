"""Session directories on this machine, and the plumbing of a process a node starts.

Every cluster started on this machine keeps a session directory under this user's
**session root** (0700, owner-checked, never followed through a symlink): its logs,
its cluster token (``token``) and its socket files (``sockets/gcs.sock``, …). Front
ends find clusters here (the Jupyter server extension lists ``session_*`` entries) and
read the token to connect; only clusters run by this user can be found that way.

The second half is for processes a lumos node starts that live outside the engine
(the dashboard's ``python -m lumos.dashboard``): tie their life to the parent, log to
the session's log directory, report readiness on the pipe the parent handed down,
and write files other local users cannot read or replace.

This module re-exports ``lumos._private`` helpers under stable names.

Example:
    >>> root = lumos.util.session.session_root()
    >>> info = lumos.util.session.current()   # what lumos.init() returned, or None
"""

from __future__ import annotations

from typing import Any

from lumos._private import worker_context
from lumos._private.node import session_root as _session_root
from lumos._private.process import UnsafePathError as UnsafePathError
from lumos._private.process import die_with_parent as _die_with_parent
from lumos._private.process import read_token as _read_token
from lumos._private.process import report_ready as _report_ready
from lumos._private.process import setup_logging as _setup_logging
from lumos._private.process import write_private_file as _write_private_file

__all__ = ["UnsafePathError", "current", "die_with_parent", "read_token", "report_ready", "session_root",
           "setup_logging", "write_private_file"]


def session_root() -> str:
    """This user's root of session directories, created 0700 if missing.

    ``LUMOS_TMPDIR`` overrides it; else ``$XDG_RUNTIME_DIR/lumos`` or ``/tmp/lumos-<uid>``.

    Raises:
        UnsafePathError: the root exists but is not private to this user (another
            owner, a symlink, open permissions): move it away or set ``LUMOS_TMPDIR``.
    """
    return _session_root()


def current() -> Any:
    """What ``lumos.init()`` returned in this process (a ``LumosContext``: ``address_info``
    with ``gcs_address`` and ``session_dir``, and ``dashboard_url``), or None when this
    process did not call ``init()`` (before it, after ``shutdown()``, in a worker)."""
    return worker_context.context


def read_token(path: str) -> bytes:
    """The cluster token stored in ``path`` (a session directory's ``token`` file).

    Raises:
        OSError: the file cannot be read.
        ValueError: it holds no plausible token (too short).
    """
    return _read_token(path)


def write_private_file(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` (mode 0600) through a fresh file renamed into place:
    never through a symlink or into a file someone else made; readers see the old or
    the new content, never half of it. The directory must be private to this user.

    Raises:
        OSError: the file cannot be written.
    """
    _write_private_file(path, data)


def die_with_parent(expected_parent: int | None = None) -> None:
    """Have the kernel SIGKILL this process when its parent exits (Linux; a no-op elsewhere).

    Args:
        expected_parent: the parent's pid as the parent saw it; when the parent is
            already gone (this process was re-parented), exit at once.
    """
    _die_with_parent(expected_parent)


def setup_logging(log_dir: str, name: str) -> str:
    """Send this process's log records to ``<log_dir>/<name>.log`` (``LUMOS_LOG_LEVEL``
    sets the level, INFO by default); returns the path. For a process's entry point only."""
    return _setup_logging(log_dir, name)


def report_ready(fd: int, info: dict[str, Any]) -> None:
    """Tell the parent this process is ready: ``info`` as one JSON line on the inherited
    pipe ``fd`` (a no-op when ``fd`` < 0), then close it."""
    _report_ready(fd, info)
