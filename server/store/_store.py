"""Opening a data directory, and :class:`Store`, which composes the parts.

Layout of a data directory ``DIR``::

    DIR/data/       the data environment (ciphertext and non-content metadata;
                    databases and keys in :mod:`server.store._schema`)
    DIR/keystore/   the keystore environment (wrapped keys), never backed up
    DIR/index/      sealed index snapshots, one per owner (:mod:`server.store._snapshots`),
                    never backed up
    DIR/lethe.lock  held (flock) by the one server process using DIR, exclusively;
                    or shared by every process of one ``lethe serve --processes N``
    DIR/lethe.primary  held (flock, exclusively) by the primary among those processes

Thread rules: every write goes through the one :class:`~server.store._writer.Writer`
thread; read methods open their own read transactions and are safe from any
thread. ``close`` from the thread that opened the store, once no call is
running.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from lethe.receipts import sign_receipt
from lethe.v1 import common_pb2, lifecycle_pb2
from server.errors import LetheError
from server.store import _schema as sk
from server.store._audit import AuditPart
from server.store._changes import ChangesPart
from server.store._events import EventsPart
from server.store._export import ExportPart
from server.store._forget import ForgetPart
from server.store._manifests import ManifestsPart
from server.store._memories import MemoriesPart
from server.store._memory_batch import MemoryBatchPart
from server.store._moves import MovesPart
from server.store._pending import PendingPart
from server.store._repairs import RepairsPart
from server.store._reserve import RESERVE_FILE, DiskReserve, map_reserve
from server.store._retention import RetentionPart
from server.store._schema import Tables
from server.store._threads import ThreadsPart
from server.store._tokens import TokensPart
from server.store._vectors import VectorsPart
from server.store._writer import Writer
from shredder import (
    EnvironmentConfigError,
    KekRing,
    KeyNotFoundError,
    Keystore,
    check_kek_placement,
    default_kek_path,
    open_durable_env,
)

_log = logging.getLogger(__name__)

KEK_ENV = "LETHE_KEK"
DEFAULT_MAX_STORE_SIZE = 64 << 30
"""Bytes the data environment may grow to by default (``--max-store-size``): its
file grows as pages are used, up to this ceiling; a write that does not fit
is refused whole with ``STORE_FULL``."""
MIN_STORE_SIZE = 1 << 20
KEYSTORE_MAP_SIZE = 8 << 30
_OPEN: dict[Path, Store] = {}
_OPEN_GUARD = threading.Lock()


def open_store_for(data_dir: Path) -> Store | None:
    """The Store this process has open on ``data_dir``, if any.

    LMDB allows one handle per environment and process, so an in-process backup
    must reuse it.
    """
    with _OPEN_GUARD:
        return _OPEN.get(data_dir.resolve())


class StoreLockedError(LetheError):
    """Another process holds the data directory."""


def data_paths(data_dir: Path) -> tuple[Path, Path]:
    """``(data environment dir, keystore dir)`` of a data directory."""
    return data_dir / "data", data_dir / "keystore"


def load_kek(data_dir: Path, store_id: str, kek_file: Path | None, *, create: bool) -> KekRing:
    """Load the KEK ring for a store.

    ``LETHE_KEK`` (tests) wins; otherwise ``kek_file`` or the default path in
    the user's config directory, never inside the data directory.

    Raises:
        EnvironmentConfigError: KEK inside ``data_dir``, missing (when not
            creating), unreadable or too permissive.
    """
    env_value = os.environ.get(KEK_ENV)
    if env_value:
        return KekRing.from_env(env_value)
    path = kek_file if kek_file is not None else default_kek_path(store_id)
    check_kek_placement(path, [data_dir])
    return KekRing.load_or_create(path, create=create)


def acquire_lock(data_dir: Path, *, shared: bool = False) -> int:
    """Take the lock of a data directory; returns its file descriptor.

    Close the descriptor to release the lock.

    Args:
        data_dir: The data directory.
        shared: Take it shared, as every process of one ``lethe serve
            --processes N`` does (each alongside the others, none alongside a
            process that took it exclusively).

    Raises:
        StoreLockedError: another process holds it (exclusively, or at all
            when taking it exclusively).
    """
    path = data_dir / "lethe.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise StoreLockedError(
            f"{data_dir} is in use by another lethe process (one server per data directory)"
        ) from None
    return fd


def acquire_primary(data_dir: Path, *, wait: bool = False) -> int | None:
    """Take the primary role among the processes sharing a data directory.

    The role is an exclusive flock on ``DIR/lethe.primary``: the kernel drops
    it when its holder dies, so another process can take over.

    Args:
        data_dir: The data directory.
        wait: Block until the role is free (a standby taking over).

    Returns:
        The lock's file descriptor (close it to give the role up), or None
        when another process holds the role and ``wait`` is False.
    """
    fd = os.open(data_dir / "lethe.primary", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class Store(
    ThreadsPart,
    RepairsPart,
    PendingPart,
    EventsPart,
    ManifestsPart,
    AuditPart,
    TokensPart,
    ForgetPart,
    MemoryBatchPart,
    MemoriesPart,
    MovesPart,
    VectorsPart,
    ExportPart,
    RetentionPart,
    ChangesPart,
):
    """The data environment, the keystore and the writer for one data directory.

    Args:
        data_dir: The data directory (created if missing).
        kek_file: The KEK file; default in the user's config directory.
        lock: Take the exclusive directory lock (a serving process must).
        max_size: Bytes the data environment may grow to (the ceiling,
            ``--max-store-size``); at least 1 MiB. Deletions may use
            :func:`~server.store._reserve.map_reserve` bytes more.
        disk_reserve: Bytes of the ballast file a deletion may free on a full
            filesystem (``--disk-reserve``); 0 for none. Only a locking (serving)
            process holds it (of several sharing the directory, the primary).
        shared: Open the directory as one of several serving processes
            (``lethe serve --processes N``): the directory lock is taken
            shared, the primary role (:func:`acquire_primary`) if it is free,
            and the change log is kept (:mod:`server.store._changes`). Needs
            ``lock``.
        standby: With ``shared``, never take the primary role (a process
            joining a running group: start-up recovery and the sweeper must
            not run beside serving processes).

    Raises:
        ValueError: ``max_size`` is below 1 MiB.
        StoreLockedError: another process holds ``data_dir`` (exclusively, or
            at all unless ``shared``).
        EnvironmentConfigError: LMDB flags or KEK placement are unsafe, or the
            data environment belongs to another keystore.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        kek_file: Path | None = None,
        lock: bool = True,
        max_size: int = DEFAULT_MAX_STORE_SIZE,
        disk_reserve: int = 0,
        shared: bool = False,
        standby: bool = False,
    ) -> None:
        if max_size < MIN_STORE_SIZE:
            raise ValueError(f"the store's maximum size must be at least {MIN_STORE_SIZE} bytes")
        if shared and not lock:
            raise ValueError("a shared store takes the directory lock")
        self.data_dir = data_dir.resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd: int | None = acquire_lock(self.data_dir, shared=shared) if lock else None
        self.shared = shared
        self.change_log = shared
        self._pending_changes = {}
        self._primary_fd = acquire_primary(self.data_dir) if shared and not standby else None
        lock = lock and (not shared or self._primary_fd is not None)  # the primary's duties
        data_path, ks_path = data_paths(self.data_dir)
        first_start = Keystore.read_store_id(ks_path) is None
        store_id = Keystore.init_store_id(ks_path)
        self.kek = load_kek(self.data_dir, store_id, kek_file, create=first_start)
        if lock:  # the one process that may write the KEK file: leftovers of a crash go
            removed = self.kek.remove_stray_files()
            if removed:
                _log.warning(
                    "removed %d temporary KEK files a write cut short by a crash left beside %s",
                    removed,
                    self.kek.path,
                )
        self.keystore = Keystore(ks_path, self.kek, map_size=KEYSTORE_MAP_SIZE)
        if lock:  # the serving process: its receipts are signed from the first one
            self.keystore.ensure_signing_key()
        data_path.mkdir(parents=True, exist_ok=True)
        names = Tables.names()
        self.env = open_durable_env(
            data_path, map_size=max_size + map_reserve(max_size), max_dbs=len(names) + 2
        )
        self.max_size = max_size
        self.disk_reserve = DiskReserve(self.data_dir / RESERVE_FILE, disk_reserve if lock else 0)
        if lock:
            self.disk_reserve.ensure()
        with self.env.begin(write=True) as txn:
            self.t = Tables.open(self.env, txn)
            stored = sk.get(txn, self.t.meta, sk.STORE_ID)
            if stored is None:
                txn.put(sk.STORE_ID, store_id.encode(), db=self.t.meta)
                txn.put(sk.NEXT_RID, b"1", db=self.t.meta)
            elif stored.decode() != store_id:
                raise EnvironmentConfigError(
                    "the data environment belongs to another keystore; restore only "
                    "beside the keystore it was backed up from"
                )
        self.store_id = store_id
        self._event_owners: set[str] = set()
        self._event_listeners: list[Callable[[frozenset[str]], None]] = []
        self.unreadable = {}
        self._unreadable_guard = threading.Lock()
        self._key_batch = threading.local()
        self.writer = Writer(
            self.env,
            self.keystore,
            on_commit=self._announce_events,
            guard=self.refuse_moved,
            ceiling_reached=self.ceiling_reached,
            release_reserve=self.disk_reserve.release,
            on_begin=self._begin_changes,
            before_commit=self._write_changes,
        )
        with _OPEN_GUARD:
            _OPEN[self.data_dir] = self

    def close(self) -> None:
        """Stop the writer (finishing queued writes) and close both environments."""
        with _OPEN_GUARD:
            if _OPEN.get(self.data_dir) is self:
                del _OPEN[self.data_dir]
        self.writer.close()
        self.env.close()
        self.keystore.close()
        for fd in (self._primary_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._primary_fd = self._lock_fd = None

    @property
    def primary(self) -> bool:
        """Whether this process does the directory's one-process duties.

        A store of one process always does; of several sharing the directory
        (``shared``), the one holding the primary role (:func:`acquire_primary`):
        start-up recovery, the sweeper, the audit, rotation, index snapshots,
        the disk reserve, the signing key.
        """
        return not self.shared or self._primary_fd is not None

    def sign_receipt(self, receipt: common_pb2.DeletionReceipt) -> common_pb2.DeletionReceipt:
        """Name this store on ``receipt`` and sign it with the store's key, in place.

        What is signed: :func:`lethe.receipts.signed_bytes`. A store opened beside a
        server that never started (no signing key yet) makes its first key here.

        Returns:
            ``receipt``, signed.

        Raises:
            KeyNotFoundError: the KEK version that wraps the signing key is gone.
        """
        try:
            sign_receipt(receipt, self.store_id, self.keystore.sign)
        except KeyNotFoundError:
            if self.keystore.signing_keys():
                raise
            self.keystore.ensure_signing_key()
            sign_receipt(receipt, self.store_id, self.keystore.sign)
        return receipt

    def server_info(self) -> lifecycle_pb2.ServerInfo:
        """The store's id and the public halves of every key that signs or signed its receipts.

        Oldest key first; the current one has no ``retire_time`` (``Lifecycle.GetServerInfo``).
        """
        info = lifecycle_pb2.ServerInfo(store_id=self.store_id)
        for key in self.keystore.signing_keys():
            published = info.receipt_keys.add(key_id=key.key_id, public_key=key.public_key)
            published.create_time.FromNanoseconds(round(key.create_time * 1e9))
            if key.retire_time:
                published.retire_time.FromNanoseconds(round(key.retire_time * 1e9))
        return info

    def used_bytes(self) -> int:
        """Bytes of the data environment in use: its highest page in use times the page size.

        Freed pages are reused before the file grows.
        """
        info, stat = self.env.info(), self.env.stat()
        return (int(info["last_pgno"]) + 1) * int(stat["psize"])

    def live_bytes(self) -> int:
        """Bytes of the pages that hold data now: every database's, not the free ones.

        Unlike :meth:`used_bytes` (the file's high-water mark, which never goes
        down), this falls when a forget purges rows: their pages go to LMDB's
        free list and are reused.
        """
        psize = int(self.env.stat()["psize"])
        with self.env.begin() as txn:
            stats = [self.env.stat()] + [txn.stat(getattr(self.t, n)) for n in Tables.names()]
        return psize * sum(
            int(st["branch_pages"]) + int(st["leaf_pages"]) + int(st["overflow_pages"])
            for st in stats
        )

    def ceiling_reached(self) -> bool:
        """Whether the data held reaches ``--max-store-size`` (:meth:`live_bytes`).

        Then writes that add data are refused (``STORE_FULL``) before they run and
        only deletions run, on the map's reserve (:mod:`server.store._reserve`).
        """
        return self.live_bytes() >= self.max_size

    def stray_key_files(self) -> int:
        """Temporary KEK files a crash left beside the KEK file (0 in a healthy store).

        The serving process removes them when it opens the store and after each
        write of the KEK file; ``lethe audit`` and ``lethe_stray_key_files`` count
        the ones a crash left since.
        """
        return len(self.kek.stray_files())

    @property
    def kek_rotatable(self) -> bool:
        """Whether the KEK lives in a file that rotation can rewrite.

        An in-memory ``LETHE_KEK`` could not survive a restart, so it is never
        rotated.
        """
        return self.kek.path is not None

    def reader_slots(self) -> int:
        """Reader slots of the data environment's lock table in use now.

        One per open read transaction of any process; a number that keeps
        growing means leaked read transactions.
        """
        table = self.env.readers()
        return max(0, len([line for line in table.splitlines() if line.strip()]) - 1)
