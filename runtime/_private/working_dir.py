"""``init(runtime_env={"working_dir": ...})``: the job's code directory on every worker.

The driver zips the directory (at most ``MAX_BYTES`` of files, without ``.git``,
``__pycache__`` and the ``excludes`` patterns) and stores the zip in the GCS KV under its
content hash. A worker that runs the job's first task fetches it once per node, unpacks
it under the session directory, and runs the job's tasks there: it is their working
directory and the first entry of ``sys.path``, so the job's modules import and its
relative paths resolve as on the driver.

```
driver: zip(dir) ──KvPut("pkg", sha256)──► GCS ◄──KvGet── worker: unpack once per node, chdir, sys.path
```
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import shutil
import zipfile
from typing import Any, Iterable

#: Largest working directory (bytes of files before compression), as a clear error beyond.
MAX_BYTES = 100 * 1024 * 1024
_ALWAYS_SKIPPED = (".git", "__pycache__", ".ipynb_checkpoints")


def package(path: Any, excludes: Any = None) -> tuple[str, bytes]:
    """Zip the directory ``path``; returns ``(content hash, zip bytes)``.

    Raises:
        ValueError: ``path`` is not a directory, or holds more than ``MAX_BYTES``.
        TypeError: ``path`` is not a str or path, or ``excludes`` not a list of str.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"runtime_env['working_dir'] must be a local directory path, not {type(path).__name__}")
    root = os.path.abspath(os.fspath(path))
    if not os.path.isdir(root):
        raise ValueError(f"runtime_env['working_dir'] {root!r} is not a directory (lumos takes local "
                         "directories; remote URIs and zip files are not supported)")
    patterns = _patterns(excludes)
    files: list[tuple[str, str]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        dirnames[:] = sorted(d for d in dirnames
                             if d not in _ALWAYS_SKIPPED and not _excluded(_join(rel_dir, d), patterns))
        for name in sorted(filenames):
            rel = _join(rel_dir, name)
            full = os.path.join(dirpath, name)
            if _excluded(rel, patterns) or not os.path.isfile(full):
                continue
            total += os.path.getsize(full)
            if total > MAX_BYTES:
                raise ValueError(f"runtime_env['working_dir'] {root!r} holds more than "
                                 f"{MAX_BYTES // (1024 * 1024)} MiB of files; add large data to "
                                 "'excludes' and read it from shared storage or the object store")
            files.append((full, rel))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        for full, rel in files:
            info = zipfile.ZipInfo.from_file(full, rel)
            info.date_time = (1980, 1, 1, 0, 0, 0)  # the hash depends on contents only
            info.compress_type = zipfile.ZIP_DEFLATED
            with open(full, "rb") as f:
                zf.writestr(info, f.read(), compresslevel=1)
    data = buf.getvalue()
    return hashlib.sha256(data).hexdigest()[:32], data


def unpacked_dir(session_dir: str, package: str) -> str:
    """Where a node keeps its unpacked copy of the package ``package`` (its content hash,
    alphanumeric: checked by the callers). Workers unpack into it; the raylet removes it
    when the GCS drops the package."""
    return os.path.join(session_dir, "runtime_resources", f"working_dir_{package}")


def unpack(data: bytes, target: str) -> str:
    """Unpack a working directory's zip to ``target`` (once: several workers of a node may
    race; the first rename wins). Returns ``target``."""
    if os.path.isdir(target):
        return target
    tmp = f"{target}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        for info in zf.infolist():
            dest = os.path.realpath(os.path.join(tmp, info.filename))
            if not dest.startswith(os.path.realpath(tmp) + os.sep):
                raise ValueError(f"working_dir package entry {info.filename!r} points outside it")
        zf.extractall(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isdir(target):
            raise
    return target


def _patterns(excludes: Any) -> list[str]:
    if excludes is None:
        return []
    if not isinstance(excludes, (list, tuple)) or not all(isinstance(p, str) for p in excludes):
        raise TypeError("runtime_env['excludes'] must be a list of path patterns (str)")
    return [p.strip("/") for p in excludes]


def _excluded(rel: str, patterns: Iterable[str]) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns)


def _join(rel_dir: str, name: str) -> str:
    return name if rel_dir in ("", ".") else f"{rel_dir}/{name}".replace(os.sep, "/")
