"""The keystore: wrapped ring keys and record keys in their own LMDB environment.

This module opens the keystore environment (durable flags, the ``meta`` database's format and
store id, one open handle per directory and process) and composes `Keystore` from its parts,
mixins over `shredder._keystore_base.KeystoreBase` (the table in the package docstring names
each); its byte layouts are in `shredder._keystore_schema`.

Thread rules: write methods (`create_record_keys`, `destroy`, `rewrap_record_keys`,
`ensure_signing_key`, `rotate_signing_key`, `close`) must be called from one thread at a time —
the server calls them only from its single writer thread (or before it starts), since an LMDB
write transaction is bound to the thread that began it. Read methods (`seal`, `open`,
`has_record_key`, `list_record_keys`, `key_count`, `kek_version_in_use`, `sign`,
`signing_keys`) are safe from any number of threads concurrently and never wait for the
writer. The static `read_store_id` and `init_store_id` are safe from any thread (they hold
this module's lock of open keystores). Each part's module states the rules of its own methods.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from pathlib import Path

import lmdb

from shredder._aead import _Key
from shredder._kek import KekRing
from shredder._keystore_ledger import LedgerPart
from shredder._keystore_moves import MovesPart
from shredder._keystore_records import RecordKeysPart
from shredder._keystore_rotation import RotationPart
from shredder._keystore_schema import (
    _DIRTY,
    _FORMAT,
    _LEDGER,
    _MAX_DBS,
    _META,
    _RECORDS,
    _RINGS,
    _SHREDDED,
)
from shredder._keystore_sealing import SealingPart
from shredder._keystore_shred import ShredPart
from shredder._keystore_signing import SigningPart
from shredder._lmdbenv import open_durable_env
from shredder.errors import EnvironmentConfigError

__all__ = ["Keystore"]

# Paths of keystores open in this process, to avoid opening one LMDB environment twice (which
# LMDB does not support within a process) and to answer read_store_id while it is open.
_open_lock = threading.Lock()
_open_stores: dict[Path, str] = {}


class Keystore(
    RecordKeysPart, SealingPart, ShredPart, RotationPart, MovesPart, LedgerPart, SigningPart
):
    """Wrapped keys in their own LMDB environment at `path` (a directory).

    Callers seal, open and destroy; they never see a raw key.

    Thread rules: write methods (`create_record_keys`, `destroy`, `rewrap_record_keys`,
    `close`) must be called from one thread at a time (the server calls them only from its
    single writer thread); read methods (`seal`, `open`, `has_record_key`,
    `list_record_keys`, `key_count`, `kek_version_in_use`) are safe from any thread
    concurrently. Only one `Keystore` per directory may be open in a process.
    """

    def __init__(self, path: Path, kek: KekRing, *, map_size: int = 1 << 30) -> None:
        """Open or create the keystore.

        Args:
            path: The keystore's directory.
            kek: The KEK ring that wraps ring keys.
            map_size: Maximum size of the keystore, in bytes.

        Raises:
            EnvironmentConfigError: If the environment cannot be opened with durable flags,
                holds another format, or is already open in this process.
        """
        self._path = Path(path).resolve()
        self._kek = kek
        with _open_lock:
            if self._path in _open_stores:
                raise EnvironmentConfigError(f"keystore {self._path} is already open")
            self._env = open_durable_env(self._path, map_size=map_size, max_dbs=_MAX_DBS)
            try:
                self._store_id = _init_meta(self._env)
                with self._env.begin(write=True) as txn:
                    self._rings = self._env.open_db(_RINGS, txn=txn)
                    self._records = self._env.open_db(_RECORDS, txn=txn)
                    self._dirty = self._env.open_db(_DIRTY, txn=txn)
                    self._shredded = self._env.open_db(_SHREDDED, txn=txn)
                    self._ledger = self._env.open_db(_LEDGER, txn=txn)
                    self._meta = self._env.open_db(_META, txn=txn)
            except BaseException:
                self._env.close()
                raise
            _open_stores[self._path] = self._store_id
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[tuple[bytes, bytes], _Key] = OrderedDict()
        # Unwrapped record keys by ring prefix (LRU over rings), then by their LMDB key, with
        # the wrapped value they came from: see _record_key_in.
        self._record_cache: OrderedDict[bytes, dict[bytes, tuple[bytes, _Key]]] = OrderedDict()
        self._record_cached = 0
        self._epoch = 0
        self._signer_lock = threading.Lock()
        self._signer = None
        self._closed = False

    # ----------------------------------------------------------------- store id

    @staticmethod
    def read_store_id(path: Path) -> str | None:
        """Return the keystore's id without needing the KEK.

        Args:
            path: The keystore's directory.

        Returns:
            The store id (32 hex characters), or None if no keystore exists at `path` yet.

        Raises:
            EnvironmentConfigError: If the environment exists but cannot be opened or is not
                a keystore.
        """
        resolved = Path(path).resolve()
        with _open_lock:
            if resolved in _open_stores:
                return _open_stores[resolved]
            if not (resolved / "data.mdb").exists():
                return None
            env = open_durable_env(resolved, map_size=1 << 20, max_dbs=_MAX_DBS, readonly=True)
            try:
                try:
                    meta = env.open_db(_META, create=False)
                except lmdb.NotFoundError:
                    return None
                with env.begin(db=meta) as txn:
                    raw = txn.get(b"store_id")
                    fmt = txn.get(b"format")
            finally:
                env.close()
        if raw is None:
            return None
        if fmt != _FORMAT:
            raise EnvironmentConfigError(f"{resolved} is not a {_FORMAT.decode()} keystore")
        return raw.decode("ascii")

    @staticmethod
    def init_store_id(path: Path) -> str:
        """Create the keystore environment if needed and return its id.

        Args:
            path: The keystore's directory.

        Returns:
            The store id; a new random UUID4 in hex on first creation.

        Raises:
            EnvironmentConfigError: If the environment cannot be opened or created with
                durable flags, or holds another format.
        """
        resolved = Path(path).resolve()
        with _open_lock:
            if resolved in _open_stores:
                return _open_stores[resolved]
            env = open_durable_env(resolved, map_size=1 << 20, max_dbs=_MAX_DBS)
            try:
                return _init_meta(env)
            finally:
                env.close()

    @property
    def store_id(self) -> str:
        """The keystore's random id (32 hex characters), stable for its lifetime."""
        return self._store_id

    @property
    def path(self) -> Path:
        """The keystore's directory, resolved."""
        return self._path

    def close(self) -> None:
        """Close the environment and drop every cached key. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._cache_lock:
            self._epoch += 1
            self._cache.clear()
            self._clear_record_cache()
        with self._signer_lock:
            self._signer = None
        self._env.close()
        with _open_lock:
            _open_stores.pop(self._path, None)

    def __enter__(self) -> Keystore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Keystore {self._path} store_id={self._store_id}>"


def _init_meta(env: lmdb.Environment) -> str:
    """Create the meta database if needed and return the store id.

    Raises:
        EnvironmentConfigError: If the environment holds another format.
    """
    with env.begin(write=True) as txn:
        meta = env.open_db(_META, txn=txn)
        fmt = txn.get(b"format", db=meta)
        store_id = txn.get(b"store_id", db=meta)
        if fmt is None and store_id is None:
            fmt, store_id = _FORMAT, uuid.uuid4().hex.encode("ascii")
            txn.put(b"format", fmt, db=meta)
            txn.put(b"store_id", store_id, db=meta)
        if fmt != _FORMAT or store_id is None:
            raise EnvironmentConfigError(f"environment is not a {_FORMAT.decode()} keystore")
    return store_id.decode("ascii")
