"""Room to forget: the reserves that deletions may use and growth may not.

Erasure is the operation a person needs most when a store is in trouble, and the
one that frees space, so a full store must still be able to forget. Two reserves
keep room for it:

- **Under ``--max-store-size``** (the *ceiling*): the data environment's LMDB map
  is the ceiling plus :func:`map_reserve` bytes. A write that adds data (an
  append, a memory, a commit…) is refused with ``STORE_FULL`` once the store's
  used bytes reach the ceiling, before it runs; the deletions (the two steps of
  a forget, a repair's conclusion, an owner's release: :data:`ESSENTIAL`) may
  use the map past it, up to the reserve.
- **On a full filesystem**: a ballast file (:class:`DiskReserve`,
  ``--disk-reserve`` bytes, default 16 MiB) is allocated in the data directory
  while there is room. When a deletion fails for want of disk space, the writer
  frees the ballast and tries the deletion again once; the sweeper allocates
  the ballast again when the filesystem has room for twice its size.

Past a reserve — a deletion larger than what is left of it (tombstones of
hundreds of thousands of turns in one request), or a filesystem full with the
ballast already spent — the deletion is refused like any write (``STORE_FULL``
or ``UNAVAILABLE``) and nothing of it is applied: forget in smaller steps (a
thread at a time), or make room (raise ``--max-store-size``, free the disk).

Thread rules: :class:`DiskReserve` ``release`` runs on the writer thread,
``ensure`` on the sweeper's or at start-up; both take its lock.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

_log = logging.getLogger(__name__)

ESSENTIAL = frozenset(
    {
        "forget.plan",
        "forget.finish",
        "repair.conclude",
        "owner.purge",
        "echo.key",  # a forget's guard bucket key: made before its plan
        "echo.expire",
        "keys.destroy_stray",  # it only deletes: start-up's strays, a discarded snapshot's key
    }
)
"""Write ops that may use the reserves: the steps of a deletion. An owner's placement
markers (a move's steps, which add no data) may too (``WriteOp.essential``)."""

MIN_MAP_RESERVE = 16 << 20
"""The least map reserve, bytes (16 MiB)."""
DEFAULT_DISK_RESERVE = 16 << 20
"""``--disk-reserve``'s default, bytes (16 MiB: a forget of a thread of thousands of
turns writes well under 1 MiB to the data environment and the keystore)."""
RESERVE_FILE = "reserve.bin"
"""The ballast's name in the data directory (never part of a backup: not in ``data/``)."""


def map_reserve(ceiling: int) -> int:
    """Bytes of LMDB map past the ceiling that only deletions may use.

    Args:
        ceiling: ``--max-store-size``, bytes.

    Returns:
        ``max(16 MiB, ceiling / 32)``: 2 GiB at the default 64 GiB ceiling. The
        map is address space, not disk: the file grows only as pages are used.
    """
    return max(MIN_MAP_RESERVE, ceiling // 32)


class DiskReserve:
    """A ballast file of ``size`` bytes that a deletion on a full filesystem may free.

    Args:
        path: the ballast file (in the data directory).
        size: its size in bytes; 0 disables it.
    """

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self._lock = threading.Lock()

    def held(self) -> int:
        """Bytes the ballast holds now (0 when released, disabled, or never allocated)."""
        try:
            return min(self.size, os.stat(self.path).st_blocks * 512) if self.size else 0
        except FileNotFoundError:
            return 0

    def ensure(self) -> bool:
        """Allocate the ballast if it is missing and the filesystem has room for it.

        Room means twice its size free (the ballast, and as much again for the
        writes that follow, so allocating it never fills the disk). A ballast that cannot
        be allocated (the disk filled meanwhile) is removed again, never left half.

        Returns:
            Whether the ballast is held after the call.
        """
        if not self.size:
            return False
        with self._lock:
            if self.held() >= self.size:
                return True
            try:
                free = os.statvfs(self.path.parent)
            except OSError:
                return False
            if free.f_bavail * free.f_frsize < 2 * self.size:
                return False
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
                try:
                    os.posix_fallocate(fd, 0, self.size)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                self.path.unlink(missing_ok=True)
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    _log.warning("cannot allocate the disk reserve %s: %s", self.path, exc)
                return False
            return True

    def release(self) -> int:
        """Free the ballast so a deletion can write on a full filesystem.

        Returns:
            The bytes freed (0 when none was held).
        """
        with self._lock:
            freed = self.held()
            self.path.unlink(missing_ok=True)
        if freed:
            _log.warning(
                "the disk is full: released the %d-byte disk reserve for a deletion", freed
            )
        return freed
