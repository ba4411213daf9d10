"""File copies between the object store and the spill directory (raylet threads only).

Called by ``RayletServer`` for the ``SpillObject``, ``RestoreObject`` and on-disk
``GrantCreate`` actions of ``ObjectStoreState``, always in its ``raylet.spill`` thread
pool, never on the loop. Bytes move file to file in the kernel (``copy_file_range``,
else ``sendfile``): no pickling, no copies through Python objects. Every file is
created ``O_EXCL | O_NOFOLLOW`` (mode 0600) under a temporary name, preallocated with
``posix_fallocate`` so a full disk is an ``ENOSPC`` here rather than a ``SIGBUS`` in a
process writing through a mapping, and renamed into place when complete.
"""

from __future__ import annotations

import errno
import os
import time

from lumos._private.ids import NodeID

#: errnos that mean "no room on the spill disk" (OutOfDiskError for the user).
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)

_FALLBACK_ERRNOS = (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF)


def create_exclusive(path: str, size_bytes: int) -> int:
    """A new file at ``path`` (never through a symlink), ``size_bytes`` preallocated.
    A stale file of ours under that name (a crashed copy's) is replaced."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        os.unlink(path)  # the directory is ours alone (0700, checked at start)
        fd = os.open(path, flags, 0o600)
    try:
        if size_bytes:
            os.posix_fallocate(fd, 0, size_bytes)
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    return fd


def copy_file(src: str, tmp: str, dst: str, size_bytes: int) -> float:
    """Copy ``size_bytes`` of ``src`` into a new file ``tmp``, rename it to ``dst``.
    Returns the seconds the copy took. Raises OSError (``DISK_FULL_ERRNOS`` for no room)."""
    t0 = time.monotonic()
    fd_in = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        fd_out = create_exclusive(tmp, size_bytes)
        try:
            _copy_range(fd_in, fd_out, size_bytes)
            os.rename(tmp, dst)
        except BaseException:
            _unlink(tmp)
            raise
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    return time.monotonic() - t0


def preallocate(path: str, size_bytes: int) -> None:
    """Create ``path`` with ``size_bytes`` allocated, for a process to write through a mapping."""
    os.close(create_exclusive(path, size_bytes))


def _copy_range(fd_in: int, fd_out: int, size: int) -> None:
    off = 0
    use_cfr = hasattr(os, "copy_file_range")
    while off < size:
        n = 0
        if use_cfr:
            try:
                n = os.copy_file_range(fd_in, fd_out, size - off, off, off)
            except OSError as e:
                if e.errno not in _FALLBACK_ERRNOS:
                    raise
                use_cfr = False
                continue
        else:
            os.lseek(fd_out, off, os.SEEK_SET)
            n = os.sendfile(fd_out, fd_in, off, min(size - off, 1 << 30))
        if n == 0:
            raise OSError(errno.EIO, f"source file ended at byte {off} of {size}")
        off += n


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def node_spill_dir(spilling_directory: str, session_dir: str, node_id: NodeID) -> str:
    """A node's private spill directory: under ``object_spilling_directory`` when set,
    else under the session directory. The raylet creates it (0700) and removes it at
    stop; the process that started the raylet removes it too, should the raylet die."""
    base = spilling_directory or os.path.join(session_dir, "spill")
    return os.path.join(base, f"node-{node_id.hex()[:12]}")
