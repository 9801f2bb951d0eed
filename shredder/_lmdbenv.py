"""Opening LMDB environments with durable settings, and syncing a directory.

Both the data environment (opened by `server`) and the keystore environment run with ``sync``,
``metasync`` and ``meminit`` on and ``writemap`` and ``map_async`` off: a committed write
transaction is on disk when commit returns, and freed page contents never leak into new pages
from uninitialised memory. `open_durable_env` refuses to hand out an environment that does not
report these flags. `fsync_dir` makes a rename or an unlink in a directory durable (every
file the package writes by rename, and the server's index snapshots, use it).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import lmdb

from shredder.errors import EnvironmentConfigError

DEFAULT_MAX_READERS = 1024
"""Reader slots of an environment's lock table (LMDB's default is 126). One slot
per read transaction of any process, from its begin until py-lmdb frees the
``Transaction`` object: a finished read transaction is only reset, so it keeps
its slot (under ``MDB_NOTLS``) as long as anything references it. The crash
harness filled 126 slots that way: failed reads whose frames were kept by
errors in reference cycles (``server.edge._admission.release_frames`` clears those
frames now). The extra slots are headroom, and ``lethe_lmdb_readers`` watches
the count. A slot costs 64 bytes of lock file."""
_log = logging.getLogger(__name__)


def fsync_dir(directory: Path) -> None:
    """Sync a directory, so that the renames and unlinks in it so far survive a crash.

    Raises:
        OSError: The directory cannot be opened or synced.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_REQUIRED_FLAGS = {
    "sync": True,
    "metasync": True,
    "meminit": True,
    "writemap": False,
    "map_async": False,
    "lock": True,
    "subdir": True,
}


def open_durable_env(
    path: Path,
    *,
    map_size: int,
    max_dbs: int,
    readonly: bool = False,
    max_readers: int = DEFAULT_MAX_READERS,
) -> lmdb.Environment:
    """Open (creating if needed, unless `readonly`) an LMDB environment in directory `path`.

    A new directory is created with mode 0700 and the data and lock files with mode 0600.

    Args:
        path: The environment's directory (``data.mdb`` and ``lock.mdb`` inside).
        map_size: Maximum size of the database, in bytes.
        max_dbs: Number of named databases the environment may hold.
        readonly: Open read-only; the environment must exist.
        max_readers: Maximum concurrent read transactions.

    Returns:
        The open environment, flags verified.

    Raises:
        EnvironmentConfigError: If LMDB cannot open the environment (missing when `readonly`,
            permissions, bad map size), or if the opened environment does not report
            sync, metasync, meminit and lock on and writemap and map_async off.
    """
    path = Path(path)
    if not readonly and not path.exists():
        try:
            path.mkdir(mode=0o700, parents=True)
            os.chmod(path, 0o700)  # mkdir's mode is reduced by the umask
        except FileExistsError:
            pass
        except OSError as exc:
            raise EnvironmentConfigError(f"cannot create {path}: {exc.strerror}") from None
    try:
        env = lmdb.open(
            str(path),
            map_size=map_size,
            max_dbs=max_dbs,
            max_readers=max_readers,
            readonly=readonly,
            create=not readonly,
            subdir=True,
            sync=True,
            metasync=True,
            meminit=True,
            writemap=False,
            map_async=False,
            lock=True,
            mode=0o700,  # py-lmdb drops the execute bits for files: 0600
        )
    except lmdb.Error as exc:
        raise EnvironmentConfigError(f"cannot open LMDB environment {path}: {exc}") from None
    flags = env.flags()
    wrong = sorted(name for name, want in _REQUIRED_FLAGS.items() if flags.get(name) is not want)
    if wrong:
        env.close()
        raise EnvironmentConfigError(
            f"LMDB environment {path} has unsafe flags: {', '.join(wrong)}"
        )
    # A process that died holding read transactions (SIGKILL, OOM) while another
    # kept the environment open leaves their slots in the lock file's reader
    # table; LMDB frees them only when asked (mdb_reader_check). Stale slots add
    # up over crashes until a read answers MDB_READERS_FULL.
    stale = env.reader_check()
    if stale:
        _log.warning("LMDB environment %s: freed %d stale reader slots", path, stale)
    return env
