r"""The keystore: wrapped ring keys and record keys in their own LMDB environment.

The keystore is a separate environment (directory) from the data environment, so a copy of the
data never carries keys and destroying a key never needs the data. It holds three named
databases:

``meta``
    ``b"format"`` -> ``b"lethe-keystore/1"``; ``b"store_id"`` -> 32 ASCII hex characters
    (a random UUID4), readable without the KEK.

``rings`` — one entry per ring key. LMDB key (the *ring prefix*)::

    thread ring:  owner (1-63 bytes) | 0x00 | b"T" | thread (1-63 bytes) | 0x00
    owner ring:   owner (1-63 bytes) | 0x00 | b"O" | 0x00

  Value, 81 bytes::

    offset  size  field
    0       4     ring-key generation, unsigned big-endian (1 for a new ring)
    4       77    the ring key wrapped under a KEK version (layout in `shredder._aead`;
                  its 4-byte version field is the KEK version)

``shredded`` — the shred log: one entry per deliberate destruction (ids only, never key
  material). LMDB key: a record key's LMDB key (below) and ``owner | 0x00 | b"K" | key id``
  (the same key found by id, whichever ring held it), a ring prefix (the whole ring), or an
  owner prefix ``owner | 0x00`` (every ring of the owner); value: the time of the latest such
  destruction, ASCII decimal seconds. It lets start-up tell a record whose key was destroyed on
  purpose (its forget is decided) from one whose key went missing (kept and reported).

``records`` — one entry per record key. LMDB key::

    ring prefix (as above) | key id (1-256 bytes of UTF-8, no 0x00)

  Value, 77 bytes: the record key wrapped under its ring key (its 4-byte version field is the
  ring-key generation).

Owner and thread ids match ``[a-z0-9][a-z0-9-]{0,62}`` and never contain 0x00, so every ring
prefix ends at its first 0x00 after the ring kind, owner ``a``'s prefix ``a\x00`` is never a
prefix of owner ``ab``'s keys, and a thread ring's prefix is never a prefix of another
thread's. Range deletes of an owner (prefix ``owner | 0x00``) and of a ring (its ring prefix)
are cursor prefix scans.

Associated data of wrapped keys (encoded as in `shredder._aead`):

- ring key: ``"lethe-wrap/1", "ring", owner, ring kind ("T"/"O"), thread or "", KEK version,
  ring-key generation``;
- record key: ``"lethe-wrap/1", "record", owner, ring kind, thread or "", key id, ring-key
  generation``.

Thread rules: write methods (`create_record_keys`, `destroy`, `rewrap_record_keys`, `close`)
must be called from one thread at a time — the server calls them only from its single writer
thread, since an LMDB write transaction is bound to the thread that began it. Read methods
(`seal`, `open`, `has_record_key`, `list_record_keys`, `key_count`, `kek_version_in_use`) are
safe from any number of threads concurrently and never wait for the writer.

Unwrapped ring keys are cached in memory (bounded LRU guarded by a lock) for the hot path that
decrypts search hits; record keys are unwrapped per call and never cached. Destroying a ring
evicts its cached key, and a reader that raced with the destroy cannot put it back (the cache
has an epoch that every destroy advances).
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import NoReturn

import lmdb
import nacl.encoding
import nacl.hash

from shredder._aead import (
    WRAPPED_KEY_SIZE,
    AssociatedData,
    RingRef,
    _encode_fields,
    _Key,
    _open_payload,
    _seal_payload,
    _unwrap_key,
    _wrap_key,
    _wrapped_version,
)
from shredder._bundle import ReceiveKey, open_bundle, seal_bundle
from shredder._failpoints import declare, failpoint
from shredder._kek import KekRing
from shredder._lmdbenv import open_durable_env
from shredder.errors import (
    EnvironmentConfigError,
    IntegrityError,
    KeyExistsError,
    KeyNotFoundError,
)

__all__ = ["FreshKeys", "Keystore"]

FP_ROTATE_AFTER_KEK = declare(
    "keystore.rotate.after_kek",
    "a new KEK version is in the KEK file; the keystore is not re-wrapped",
)
FP_ROTATE_AFTER_KEYSTORE = declare(
    "keystore.rotate.after_rewrap",
    "ring keys are re-wrapped under the new KEK version; older versions are not destroyed",
)

_FORMAT = b"lethe-keystore/1"
_META = b"meta"
_RINGS = b"rings"
_RECORDS = b"records"
_DIRTY = b"dirty"  # rings that lost or gave away a record key since the last rotation
_SHREDDED = b"shredded"  # the shred log (see the module docstring)
_MAX_DBS = 5
_UNROTATED = b"unrotated_since"  # meta: seconds of the oldest shred not yet rotated
_SEP = b"\x00"
_THREAD_RING = b"T"
_OWNER_RING = b"O"
_KEY_ID_LOG = b"K"  # shred-log entries of a record key by id
_WRAP_TAG = "lethe-wrap/1"
_MAX_KEY_ID_BYTES = 256
_RING_VALUE_SIZE = 4 + WRAPPED_KEY_SIZE
_CACHE_SIZE = 65536
_RECORD_CACHE_SIZE = 32768
"""Most unwrapped record keys kept between calls (about 8 MiB): see Keystore._record_key_in."""
_FIRST_GENERATION = 1

# Paths of keystores open in this process, to avoid opening one LMDB environment twice (which
# LMDB does not support within a process) and to answer read_store_id while it is open.
_open_lock = threading.Lock()
_open_stores: dict[Path, str] = {}


def _ring_prefix(ring: RingRef) -> bytes:
    owner = ring.owner.encode("ascii")
    if ring.thread is None:
        return owner + _SEP + _OWNER_RING + _SEP
    return owner + _SEP + _THREAD_RING + ring.thread.encode("ascii") + _SEP


def _owner_prefix(owner: str) -> bytes:
    return RingRef(owner).owner.encode("ascii") + _SEP


def _key_id_bytes(key_id: str) -> bytes:
    if not isinstance(key_id, str) or not key_id:
        raise ValueError("key id must be a non-empty str")
    raw = key_id.encode("utf-8")
    if _SEP in raw or len(raw) > _MAX_KEY_ID_BYTES:
        raise ValueError(f"key id must be 1-{_MAX_KEY_ID_BYTES} UTF-8 bytes without NUL")
    return raw


def _key_id_log_key(owner: str, key_id: str) -> bytes:
    """Shred-log key of a record key by owner and id, whichever ring held it."""
    return _owner_prefix(owner) + _KEY_ID_LOG + _key_id_bytes(key_id)


def _record_lmdb_key(ring: RingRef, key_id: str) -> bytes:
    return _ring_prefix(ring) + _key_id_bytes(key_id)


def _ring_prefix_length(raw: bytes) -> int:
    """The length in bytes of the ring prefix at the start of an LMDB key."""
    owner_end = raw.index(_SEP)
    if raw[owner_end + 1 : owner_end + 2] == _OWNER_RING:
        return owner_end + 3
    return raw.index(_SEP, owner_end + 2) + 1


def _decode_ring_prefix(raw: bytes) -> tuple[RingRef, int]:
    """Decode the ring prefix at the start of an LMDB key.

    Returns:
        The ring and the length of its prefix in bytes.
    """
    size = _ring_prefix_length(raw)
    owner_end = raw.index(_SEP)
    owner = raw[:owner_end].decode("ascii")
    if raw[owner_end + 1 : owner_end + 2] == _OWNER_RING:
        return RingRef(owner), size
    return RingRef(owner, raw[owner_end + 2 : size - 1].decode("ascii")), size


def _ring_fields(ring: RingRef) -> tuple[str, str, str]:
    kind = "O" if ring.thread is None else "T"
    return ring.owner, kind, ring.thread or ""


def _ring_ad(ring: RingRef, kek_version: int, generation: int) -> bytes:
    return _encode_fields(_WRAP_TAG, "ring", *_ring_fields(ring), kek_version, generation)


def _ring_ad_builder(ring: RingRef, generation: int) -> Callable[[int], bytes]:
    def build(kek_version: int) -> bytes:
        return _ring_ad(ring, kek_version, generation)

    return build


def _record_ad(ring: RingRef, key_id: str, generation: int) -> bytes:
    return _encode_fields(_WRAP_TAG, "record", *_ring_fields(ring), key_id, generation)


class FreshKeys:
    """Record keys one :meth:`Keystore.create_record_keys` just made.

    They seal the payloads of the same batch without unwrapping each key again.
    Holds raw keys: never printed or pickled; drop it once the batch is written.
    """

    __slots__ = ("_keys",)

    def __init__(self, keys: dict[tuple[RingRef, str], _Key]) -> None:
        self._keys = keys

    def seal(
        self, ring: RingRef, key_id: str, ad: AssociatedData, plaintext: bytes
    ) -> bytes | None:
        """Seal as :meth:`Keystore.seal` would, or None when the key is not one of these."""
        key = self._keys.get((ring, key_id))
        return None if key is None else _seal_payload(key, ad.encode(), plaintext)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"<FreshKeys {len(self._keys)} redacted>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("FreshKeys holds raw keys and cannot be pickled")


class KeyReader:
    """Opens many payloads under one keystore read transaction.

    :meth:`Keystore.open` begins a read transaction and unwraps the record key
    for every payload; a search that decrypts its hits, or an index build that
    decrypts every turn's content and vector (two payloads under one record
    key), pays that per payload. A reader holds one snapshot and keeps each
    record key it looked up until :meth:`close`, so each key is read once per
    reader (and unwrapped once while the keystore's bounded cache holds it: see
    ``Keystore._record_key_in``). A key destroyed after the snapshot began
    still opens here, exactly as a
    :meth:`Keystore.open` that began before the destroy would; callers recheck
    visibility after opening, as they must anyway.

    Holds raw keys: never printed or pickled. Thread rules: one thread (an LMDB
    read transaction is bound to the thread that began it); close it on the
    same thread, before the keystore closes.
    """

    __slots__ = ("_epoch", "_keys", "_keystore", "_txn")

    def __init__(self, keystore: Keystore) -> None:
        self._keystore = keystore
        self._epoch = keystore._epoch  # read before the snapshot: see Keystore._cache_put
        self._txn: lmdb.Transaction | None = keystore._env.begin()
        self._keys: dict[tuple[RingRef, str], _Key] = {}

    def open(self, ring: RingRef, key_id: str, ad: AssociatedData, ciphertext: bytes) -> bytes:
        """Decrypt and authenticate a payload, as :meth:`Keystore.open`.

        Raises:
            KeyNotFoundError, IntegrityError, ValueError: as :meth:`Keystore.open`.
            RuntimeError: the reader is closed.
        """
        if self._txn is None:
            raise RuntimeError("the key reader is closed")
        key = self._keys.get((ring, key_id))
        if key is None:
            key = self._keystore._record_key_in(self._txn, ring, key_id, self._epoch)
            self._keys[(ring, key_id)] = key
        return _open_payload(key, ad.encode(), ciphertext)

    def close(self) -> None:
        """End the snapshot and drop the keys. Idempotent."""
        self._keys.clear()
        if self._txn is not None:
            self._txn.abort()
            self._txn = None

    def __enter__(self) -> KeyReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<KeyReader {len(self._keys)} keys redacted>"

    def __reduce__(self) -> NoReturn:
        raise TypeError("KeyReader holds raw keys and cannot be pickled")


class Keystore:
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
        self._env.close()
        with _open_lock:
            _open_stores.pop(self._path, None)

    def __enter__(self) -> Keystore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Keystore {self._path} store_id={self._store_id}>"

    # ----------------------------------------------------------------- writes

    def create_record_keys(self, refs: Sequence[tuple[RingRef, str]]) -> FreshKeys:
        """Create one new random record key per ``(ring, key_id)`` in one synced transaction.

        A ring that does not exist yet (never created, or destroyed) gets a new random ring
        key wrapped under the current KEK version first. Either every key is created or none.

        Args:
            refs: ``(ring, key_id)`` pairs; key ids are 1-256 UTF-8 bytes without NUL.

        Returns:
            The new keys, able to seal payloads without unwrapping them again from
            the keystore (the writer seals a batch's payloads with them, then drops them).

        Raises:
            KeyExistsError: If a key id already exists in its ring or repeats within `refs`.
            ValueError: If a key id is malformed.
            CryptoError: If an existing ring key cannot be unwrapped (wrong KEK, tampering,
                KEK version unavailable).
        """
        new_rings: list[tuple[bytes, bytes, _Key]] = []
        fresh: dict[tuple[RingRef, str], _Key] = {}
        with self._env.begin(write=True) as txn:
            ring_keys: dict[bytes, tuple[int, _Key]] = {}
            for ring, key_id in refs:
                prefix = _ring_prefix(ring)
                lmdb_key = prefix + _key_id_bytes(key_id)
                if prefix not in ring_keys:
                    value = txn.get(prefix, db=self._rings)
                    if value is None:
                        ring_key = _Key.generate()
                        generation = _FIRST_GENERATION
                        value = struct.pack(">I", generation) + self._kek._wrap(
                            _ring_ad_builder(ring, generation), ring_key
                        )
                        txn.put(prefix, value, db=self._rings)
                        new_rings.append((prefix, value, ring_key))
                        ring_keys[prefix] = (generation, ring_key)
                    else:
                        ring_keys[prefix] = self._unwrap_ring(ring, prefix, value, self._epoch)
                generation, ring_key = ring_keys[prefix]
                record_key = _Key.generate()
                wrapped = _wrap_key(
                    ring_key, generation, _record_ad(ring, key_id, generation), record_key
                )
                if not txn.put(lmdb_key, wrapped, db=self._records, overwrite=False):
                    raise KeyExistsError(f"record key {key_id!r} already exists in its ring")
                fresh[(ring, key_id)] = record_key
        for prefix, value, ring_key in new_rings:
            self._cache_put(prefix, value, ring_key, self._epoch)
        return FreshKeys(fresh)

    def destroy(
        self,
        *,
        record_keys: Sequence[tuple[RingRef, str]] = (),
        rings: Sequence[RingRef] = (),
        owners: Sequence[str] = (),
        logged: bool = True,
    ) -> int:
        """Delete keys in one write transaction, sync the environment, evict cached keys.

        Destroying what does not exist is not an error. Once this returns, no `open` of a
        destroyed key succeeds in this process and the deletion is on disk.

        Args:
            record_keys: ``(ring, key_id)`` record keys to delete.
            rings: Rings to delete, each with every record key under it.
            owners: Owner ids whose every ring (thread rings and the owner ring) is to be
                deleted with every record key under them.
            logged: Record the destruction in the shred log, in the same transaction
                (False only for keys no record ever used: keys made for a write that
                failed).

        Returns:
            The number of keys deleted (ring keys plus record keys).

        Raises:
            ValueError: If an id is malformed.
        """
        record_lmdb_keys = [_record_lmdb_key(ring, key_id) for ring, key_id in record_keys]
        ring_prefixes = [_ring_prefix(ring) for ring in rings]
        owner_prefixes = [_owner_prefix(owner) for owner in owners]
        evict: set[bytes] = set(ring_prefixes)
        deleted = 0
        now = repr(time.time()).encode()
        with self._env.begin(write=True) as txn:
            if logged:
                by_id = [_key_id_log_key(ring.owner, key_id) for ring, key_id in record_keys]
                for key in (*record_lmdb_keys, *by_id, *ring_prefixes, *owner_prefixes):
                    txn.put(key, now, db=self._shredded)
            for (ring, _), lmdb_key in zip(record_keys, record_lmdb_keys, strict=True):
                if txn.delete(lmdb_key, db=self._records):
                    deleted += 1
                    txn.put(_ring_prefix(ring), b"", db=self._dirty)
            if record_lmdb_keys or ring_prefixes or owner_prefixes:
                self._mark_unrotated(txn)
            for prefix in ring_prefixes:
                deleted += bool(txn.delete(prefix, db=self._rings))
                deleted += _delete_prefix(txn, self._records, prefix)
            for prefix in owner_prefixes:
                cursor = txn.cursor(db=self._rings)
                if cursor.set_range(prefix):
                    for key in cursor.iternext(keys=True, values=False):
                        if not key.startswith(prefix):
                            break
                        evict.add(bytes(key))
                deleted += _delete_prefix(txn, self._rings, prefix)
                deleted += _delete_prefix(txn, self._records, prefix)
        self._env.sync(True)
        with self._cache_lock:
            self._epoch += 1
            for cached in [c for c in self._cache if c[0] in evict]:
                del self._cache[cached]
            for prefix in evict:
                self._record_cached -= len(self._record_cache.pop(prefix, ()))
            for (ring, _), lmdb_key in zip(record_keys, record_lmdb_keys, strict=True):
                held = self._record_cache.get(_ring_prefix(ring))
                if held is not None and held.pop(lmdb_key, None) is not None:
                    self._record_cached -= 1
        return deleted

    def rewrap_record_keys(self, refs: Sequence[tuple[RingRef, str]], to_ring: RingRef) -> None:
        """Move record keys to another ring in one synced transaction.

        Each record key is unwrapped under its ring's key, wrapped under `to_ring`'s key
        (creating `to_ring` if it does not exist) with the same key id, and its old entry
        deleted. Ciphertext sealed under a moved key opens as before, via `to_ring`; the old
        ring no longer reaches it. Pairs already in `to_ring` are left as they are.

        Args:
            refs: ``(ring, key_id)`` record keys to move.
            to_ring: The ring to move them to.

        Raises:
            KeyNotFoundError: If a listed record key or its ring does not exist.
            KeyExistsError: If `to_ring` already holds a key with a moved key id.
            CryptoError: If a ring key or record key fails to unwrap.
            ValueError: If an id is malformed.
        """
        to_prefix = _ring_prefix(to_ring)
        new_ring: tuple[bytes, _Key] | None = None
        with self._env.begin(write=True) as txn:
            value = txn.get(to_prefix, db=self._rings)
            if value is None:
                to_key = _Key.generate()
                to_generation = _FIRST_GENERATION
                value = struct.pack(">I", to_generation) + self._kek._wrap(
                    _ring_ad_builder(to_ring, to_generation), to_key
                )
                txn.put(to_prefix, value, db=self._rings)
                new_ring = (value, to_key)
            else:
                to_generation, to_key = self._unwrap_ring(to_ring, to_prefix, value, self._epoch)
            for ring, key_id in refs:
                prefix = _ring_prefix(ring)
                if prefix == to_prefix:
                    continue
                old_lmdb_key = prefix + _key_id_bytes(key_id)
                ring_value = txn.get(prefix, db=self._rings)
                wrapped = txn.get(old_lmdb_key, db=self._records)
                if ring_value is None or wrapped is None:
                    raise KeyNotFoundError(f"record key {key_id!r} does not exist in its ring")
                generation, ring_key = self._unwrap_ring(ring, prefix, ring_value, self._epoch)
                record_key = _unwrap_key(ring_key, _record_ad(ring, key_id, generation), wrapped)
                rewrapped = _wrap_key(
                    to_key, to_generation, _record_ad(to_ring, key_id, to_generation), record_key
                )
                if not txn.put(
                    to_prefix + old_lmdb_key[len(prefix) :],
                    rewrapped,
                    db=self._records,
                    overwrite=False,
                ):
                    raise KeyExistsError(f"record key {key_id!r} already exists in target ring")
                txn.delete(old_lmdb_key, db=self._records)
                # The old wrapped copy may linger in a free page: its ring must be renewed.
                txn.put(prefix, b"", db=self._dirty)
                self._mark_unrotated(txn)
        with self._cache_lock:  # the moved keys' old entries no longer exist
            self._epoch += 1
            for ring, key_id in refs:
                held = self._record_cache.get(_ring_prefix(ring))
                if held is not None and held.pop(_record_lmdb_key(ring, key_id), None) is not None:
                    self._record_cached -= 1
        if new_ring is not None:
            self._cache_put(to_prefix, new_ring[0], new_ring[1], self._epoch)

    def _mark_unrotated(self, txn: lmdb.Transaction) -> None:
        if txn.get(_UNROTATED, db=self._meta) is None:
            txn.put(_UNROTATED, repr(time.time()).encode(), db=self._meta)

    def unrotated_since(self) -> float | None:
        """When the oldest key destruction not yet completed by :meth:`rotate` happened.

        Seconds since the epoch, or None when there is none.
        """
        with self._env.begin() as txn:
            raw = txn.get(_UNROTATED, db=self._meta)
        return None if raw is None else float(bytes(raw))

    def rotate(self) -> tuple[int, int, list[int]]:
        """Complete every shred cryptographically.

        This is phase 2 of ARCHITECTURE.md, "Keys and crypto-shredding".

        1. A new KEK version is added and made current (the KEK file first).
        2. In one synced transaction: every ring that lost or gave away a record
           key since the last rotation gets a new random ring key (generation
           + 1) and its live record keys are re-wrapped under it; then every
           ring key is re-wrapped under the new KEK version.
        3. Every older KEK version is destroyed.

        After this, a destroyed wrapped key that lingers in a free page or a
        keystore snapshot is wrapped under a ring key that exists nowhere, or
        under a KEK version that exists nowhere: it opens nothing.

        Returns:
            (rings renewed, ring keys re-wrapped, KEK versions retired).

        Raises:
            CryptoError: a stored key fails to unwrap (nothing is changed).
            OSError: the KEK file cannot be rewritten.
        """
        old_versions = sorted(self._kek.versions)
        self._kek.add_version()
        failpoint(FP_ROTATE_AFTER_KEK)
        renewed = rewrapped = 0
        with self._env.begin(write=True) as txn:
            dirty = {bytes(k) for k, _ in txn.cursor(db=self._dirty)}
            rings = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=self._rings)]
            for prefix, value in rings:
                ring, _ = _decode_ring_prefix(prefix)
                generation, ring_key = self._unwrap_ring(ring, prefix, value, self._epoch)
                if prefix in dirty:
                    new_generation = generation + 1
                    new_key = _Key.generate()
                    cur = txn.cursor(db=self._records)
                    updates = []
                    if cur.set_range(prefix):
                        for raw_key, wrapped in cur:
                            lmdb_key = bytes(raw_key)
                            if not lmdb_key.startswith(prefix):
                                break
                            key_id = lmdb_key[len(prefix) :].decode("utf-8")
                            record_key = _unwrap_key(
                                ring_key, _record_ad(ring, key_id, generation), bytes(wrapped)
                            )
                            updates.append(
                                (
                                    lmdb_key,
                                    _wrap_key(
                                        new_key,
                                        new_generation,
                                        _record_ad(ring, key_id, new_generation),
                                        record_key,
                                    ),
                                )
                            )
                    for lmdb_key, wrapped in updates:
                        txn.put(lmdb_key, wrapped, db=self._records)
                    generation, ring_key = new_generation, new_key
                    renewed += 1
                txn.put(
                    prefix,
                    struct.pack(">I", generation)
                    + self._kek._wrap(_ring_ad_builder(ring, generation), ring_key),
                    db=self._rings,
                )
                rewrapped += 1
            txn.drop(self._dirty, delete=False)
            txn.delete(_UNROTATED, db=self._meta)
        self._env.sync(True)
        with self._cache_lock:
            self._epoch += 1
            self._cache.clear()
            self._clear_record_cache()
        failpoint(FP_ROTATE_AFTER_KEYSTORE)
        self._kek.retire(old_versions)
        return renewed, rewrapped, old_versions

    def retire_unused_kek_versions(self) -> list[int]:
        """Finish a rotation that a crash cut short.

        Destroys every KEK version other than the current one that wraps no ring key
        any more.

        A rotation writes the new KEK version first, re-wraps the keystore in one
        transaction, then destroys the old versions; a crash after the keystore
        commit leaves an old version that wraps nothing but could still open a
        ring key lingering in a free page. Safe at any time (a version in use
        is never retired).

        Returns:
            The KEK versions destroyed (empty when there was nothing to finish).

        Raises:
            IntegrityError: a stored ring entry is malformed.
            OSError: the KEK file cannot be rewritten.
        """
        if self._kek.path is None:
            return []
        in_use = self.kek_version_in_use()
        unused = sorted(
            v for v in self._kek.versions if v != self._kek.current_version and v not in in_use
        )
        if unused:
            self._kek.retire(unused)
        return unused

    # ----------------------------------------------------------------- reads

    def seal(self, ring: RingRef, key_id: str, ad: AssociatedData, plaintext: bytes) -> bytes:
        """Encrypt a payload under a record key.

        Args:
            ring: The ring holding the record key.
            key_id: The record key's id.
            ad: What the ciphertext is bound to.
            plaintext: The payload, any length.

        Returns:
            ``len(plaintext) + 41`` bytes (layout in `shredder._aead`).

        Raises:
            KeyNotFoundError: If the record key or its ring does not exist.
            IntegrityError: If a wrapped key fails to authenticate (wrong KEK, tampering).
            ValueError: If an id is malformed.
        """
        return _seal_payload(self._record_key(ring, key_id), ad.encode(), plaintext)

    def open(self, ring: RingRef, key_id: str, ad: AssociatedData, ciphertext: bytes) -> bytes:
        """Decrypt and authenticate a payload sealed by `seal`.

        Args:
            ring: The ring holding the record key.
            key_id: The record key's id.
            ad: Must equal the associated data the payload was sealed with.
            ciphertext: Output of `seal`.

        Returns:
            The plaintext.

        Raises:
            KeyNotFoundError: If the record key or its ring does not exist (destroyed or
                never created).
            IntegrityError: If authentication fails: other associated data, a ciphertext of
                another record key, tampering, truncation, an unknown format byte, a wrapped
                key that fails to unwrap (wrong KEK).
            ValueError: If an id is malformed.
        """
        return _open_payload(self._record_key(ring, key_id), ad.encode(), ciphertext)

    def reader(self) -> KeyReader:
        """A :class:`KeyReader`: one read snapshot for opening many payloads.

        Many payloads (a search's hits, an index build) open at one transaction and
        one unwrap per record key. Use it as a context manager, from one thread.
        """
        return KeyReader(self)

    def keyed_digest(self, ring: RingRef, key_id: str, data: bytes) -> bytes:
        """A 32-byte keyed BLAKE2b digest of ``data`` under a record key.

        Lets the data environment index a value (a slot name, say) without
        holding it in plaintext: the digest is useless without the key, and
        destroying the key (crypto-shredding) makes every stored digest
        unlinkable. The personalisation ``lethe-digest-v1`` separates these
        digests from any other use of the key.

        Raises:
            KeyNotFoundError: the record key or its ring does not exist.
            IntegrityError: a wrapped key fails to unwrap.
        """
        key = self._record_key(ring, key_id)
        return nacl.hash.blake2b(
            data,
            digest_size=32,
            key=key._material,
            person=b"lethe-digest-v1",
            encoder=nacl.encoding.RawEncoder,
        )

    def has_record_key(self, ring: RingRef, key_id: str) -> bool:
        """Return whether the record key and its ring exist (without unwrapping).

        Raises:
            ValueError: If an id is malformed.
        """
        prefix = _ring_prefix(ring)
        lmdb_key = prefix + _key_id_bytes(key_id)
        with self._env.begin() as txn:
            return (
                txn.get(prefix, db=self._rings) is not None
                and txn.get(lmdb_key, db=self._records) is not None
            )

    def list_record_keys(self, owner: str | None = None) -> Iterator[tuple[RingRef, str]]:
        """List live record keys, in LMDB key order, from one consistent snapshot.

        Args:
            owner: Only this owner's keys; every owner's if None.

        Returns:
            An iterator over ``(ring, key_id)``.

        Raises:
            ValueError: If `owner` is malformed.
        """
        prefix = b"" if owner is None else _owner_prefix(owner)
        found: list[tuple[RingRef, str]] = []
        rings: dict[bytes, RingRef] = {}  # one validated RingRef per ring, not per key
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._records)
            if cursor.set_range(prefix):
                for key in cursor.iternext(keys=True, values=False):
                    if not key.startswith(prefix):
                        break
                    size = _ring_prefix_length(key)
                    ring = rings.get(key[:size])
                    if ring is None:
                        ring = rings[key[:size]] = _decode_ring_prefix(key)[0]
                    found.append((ring, key[size:].decode("utf-8")))
        return iter(found)

    def find_record_key(self, owner: str, key_id: str) -> list[RingRef]:
        """The rings of ``owner`` that hold a record key with id ``key_id``.

        Key ids are random, so normally at most one: where an interrupted move left a key.

        Raises:
            ValueError: If an id is malformed.
        """
        _key_id_bytes(key_id)  # validates
        return [ring for ring, found in self.list_record_keys(owner) if found == key_id]

    def shredded_at(self, ring: RingRef, key_id: str) -> float | None:
        """When a record key was last destroyed on purpose, in seconds since the epoch.

        The key was destroyed on its own (in this ring or, by id, in another ring of
        the owner it had moved to), with its ring, or with its owner. None if the
        shred log has no such destruction (the key is live, never existed, or went
        missing).

        Raises:
            ValueError: If an id is malformed.
        """
        prefix = _ring_prefix(ring)
        keys = (
            prefix + _key_id_bytes(key_id),
            _key_id_log_key(ring.owner, key_id),
            prefix,
            _owner_prefix(ring.owner),
        )
        with self._env.begin() as txn:
            times = [txn.get(k, db=self._shredded) for k in keys]
        found = [float(bytes(t)) for t in times if t is not None]
        return max(found) if found else None

    def key_count(self) -> int:
        """Return the number of live wrapped keys: record keys plus ring keys."""
        with self._env.begin() as txn:
            return int(txn.stat(self._rings)["entries"] + txn.stat(self._records)["entries"])

    def kek_version_in_use(self) -> set[int]:
        """Return the KEK versions that wrap live ring keys.

        Raises:
            IntegrityError: If a stored ring entry is malformed.
        """
        versions: set[int] = set()
        with self._env.begin() as txn:
            for value in txn.cursor(db=self._rings).iternext(keys=False, values=True):
                if len(value) != _RING_VALUE_SIZE:
                    raise IntegrityError("malformed ring entry")
                versions.add(_wrapped_version(value[4:]))
        return versions

    # ------------------------------------------------------------- owner moves

    def export_owner(self, owner: str, recipient_hex: str) -> tuple[bytes, int]:
        """Every key of ``owner``, sealed to a destination's receive key.

        The bundle holds each ring key unwrapped from this store's KEK (its
        plaintext exists only inside the sealed box), each record key as
        stored (wrapped under its ring key, whose wrapping does not involve the
        KEK) and the owner's shred-log entries, from one read transaction. No
        key of another owner is read.

        Args:
            owner: the owner's id.
            recipient_hex: the destination's :attr:`shredder.ReceiveKey.public_hex`.

        Returns:
            ``(sealed bundle, number of keys)``: ring keys plus record keys.

        Raises:
            ValueError: ``owner`` or ``recipient_hex`` is malformed.
            KeyNotFoundError, IntegrityError: a ring key does not unwrap.
        """
        prefix = _owner_prefix(owner)
        entries: list[tuple[bytes, bytes, bytes]] = []
        with self._env.begin() as txn:
            for key, value in _prefixed(txn, self._rings, prefix):
                ring, _ = _decode_ring_prefix(key)
                generation, ring_key = self._unwrap_ring(ring, key, value, self._epoch)
                entries.append((b"R", key, struct.pack(">I", generation) + ring_key._material))
            entries.extend((b"K", k, v) for k, v in _prefixed(txn, self._records, prefix))
            entries.extend((b"S", k, v) for k, v in _prefixed(txn, self._shredded, prefix))
        keys = sum(tag != b"S" for tag, _, _ in entries)
        return seal_bundle(entries, recipient_hex), keys

    def import_owner(self, owner: str, sealed: bytes, receive_key: ReceiveKey) -> int:
        """Store the keys of :meth:`export_owner` here, in one synced transaction.

        Each ring key is wrapped under this store's current KEK version; each
        record key is checked to unwrap under its ring key before anything is
        written. The owner's own entry in the shred log (the owner shredded
        here once before) is dropped: it arrives anew.

        Args:
            owner: the owner the bundle must hold, and only it.
            sealed: the bundle.
            receive_key: the key pair it was sealed to.

        Returns:
            The number of keys stored (ring keys plus record keys).

        Raises:
            KeyExistsError: this keystore already holds a ring of ``owner``.
            IntegrityError: the bundle is not for this key, was changed, holds
                another owner's key, or a record key does not unwrap.
        """
        prefix = _owner_prefix(owner)
        rings: dict[bytes, tuple[RingRef, int, _Key]] = {}
        records: list[tuple[bytes, bytes]] = []
        shredded: list[tuple[bytes, bytes]] = []
        for tag, key, value in open_bundle(sealed, receive_key):
            if not key.startswith(prefix):
                raise IntegrityError("the key bundle holds a key of another owner")
            if tag == b"R":
                if len(value) != 4 + 32:
                    raise IntegrityError("malformed ring key in the bundle")
                ring, _ = _decode_ring_prefix(key)
                rings[key] = (ring, struct.unpack_from(">I", value)[0], _Key(value[4:]))
            elif tag == b"K":
                records.append((key, value))
            elif tag == b"S":
                shredded.append((key, value))
            else:
                raise IntegrityError("unknown entry in the key bundle")
        for key, wrapped in records:
            ring, length = _decode_ring_prefix(key)
            held = rings.get(key[:length])
            if held is None:
                raise IntegrityError("a record key in the bundle has no ring")
            _, generation, ring_key = held
            _unwrap_key(ring_key, _record_ad(ring, key[length:].decode(), generation), wrapped)
        with self._env.begin(write=True) as txn:
            if next(_prefixed(txn, self._rings, prefix), None) is not None:
                raise KeyExistsError(f"this keystore already holds keys of owner {owner!r}")
            for key, (ring, generation, ring_key) in rings.items():
                value = struct.pack(">I", generation) + self._kek._wrap(
                    _ring_ad_builder(ring, generation), ring_key
                )
                txn.put(key, value, db=self._rings)
            for key, wrapped in records:
                txn.put(key, wrapped, db=self._records)
            txn.delete(prefix, db=self._shredded)
            for key, value in shredded:
                if key != prefix:
                    txn.put(key, value, db=self._shredded)
        self._env.sync(True)
        return len(rings) + len(records)

    def kek_opens_rings(self) -> bool:
        """Whether this store's KEK unwraps a ring stored here (True when there is none to try).

        A KEK of another store would wrap imported keys that the server, with its own
        KEK, could never open.
        """
        with self._env.begin() as txn:
            for key, value in txn.cursor(db=self._rings):
                ring, _ = _decode_ring_prefix(key)
                try:
                    self._unwrap_ring(ring, key, value, self._epoch)
                except (IntegrityError, KeyNotFoundError):
                    return False
                return True
        return True

    def evict_owner(self, owner: str) -> None:
        """Drop every cached unwrapped key of ``owner`` from this process's memory.

        For when another process destroyed or replaced its keys: a shard's owner moved.
        """
        prefix = _owner_prefix(owner)
        with self._cache_lock:
            self._epoch += 1
            for cached in [c for c in self._cache if c[0].startswith(prefix)]:
                del self._cache[cached]
            for ring in [r for r in self._record_cache if r.startswith(prefix)]:
                self._record_cached -= len(self._record_cache.pop(ring))

    # ----------------------------------------------------------------- internals

    def _record_key(self, ring: RingRef, key_id: str) -> _Key:
        epoch = self._epoch  # read before the snapshot: see _cache_put
        with self._env.begin() as txn:
            return self._record_key_in(txn, ring, key_id, epoch)

    def _record_key_in(self, txn: lmdb.Transaction, ring: RingRef, key_id: str, epoch: int) -> _Key:
        """Unwrap a record key as seen by the read transaction ``txn``.

        ``epoch`` was read before ``txn`` began.

        The ring entry and the wrapped record key are read from ``txn`` on every call, so
        a key destroyed before the snapshot never opens. What is cached (up to
        ``_RECORD_CACHE_SIZE`` keys, by ring, least recently used ring first out) is the
        unwrap: a key read again with the same wrapped bytes skips the two AEAD
        decryptions of ring and record key, the main per-hit cost of a search. The
        cache obeys the ring cache's rules: :meth:`destroy` evicts what it destroys before
        it returns (a destroyed key leaves memory with the destroy, as ring keys do),
        rotation and :meth:`close` clear it, and a reader whose snapshot predates a
        destroy never re-inserts (the epoch check).

        Raises:
            KeyNotFoundError, IntegrityError, ValueError: as :meth:`open`.
        """
        prefix = _ring_prefix(ring)
        lmdb_key = prefix + _key_id_bytes(key_id)
        ring_value = txn.get(prefix, db=self._rings)
        wrapped = txn.get(lmdb_key, db=self._records)
        if ring_value is None:
            raise KeyNotFoundError("ring does not exist")
        if wrapped is None:
            raise KeyNotFoundError("record key does not exist")
        wrapped = bytes(wrapped)
        with self._cache_lock:
            held = self._record_cache.get(prefix)
            hit = None if held is None else held.get(lmdb_key)
            if hit is not None and hit[0] == wrapped:
                self._record_cache.move_to_end(prefix)
                return hit[1]
        generation, ring_key = self._unwrap_ring(ring, prefix, bytes(ring_value), epoch)
        if _wrapped_version(wrapped) != generation:
            raise IntegrityError("record key was wrapped under another ring-key generation")
        key = _unwrap_key(ring_key, _record_ad(ring, key_id, generation), wrapped)
        with self._cache_lock:
            if epoch == self._epoch:
                held = self._record_cache.setdefault(prefix, {})
                self._record_cache.move_to_end(prefix)
                if held.get(lmdb_key) is None:
                    self._record_cached += 1
                held[lmdb_key] = (wrapped, key)
                while self._record_cached > _RECORD_CACHE_SIZE:
                    if len(self._record_cache) > 1:  # the least recently used ring goes
                        _, dropped = self._record_cache.popitem(last=False)
                        self._record_cached -= len(dropped)
                    else:  # one ring over the bound: its oldest keys go
                        del held[next(iter(held))]
                        self._record_cached -= 1
        return key

    def _clear_record_cache(self) -> None:
        """Drop every cached record key (the caller holds ``_cache_lock``)."""
        self._record_cache.clear()
        self._record_cached = 0

    @property
    def cached_record_keys(self) -> int:
        """How many unwrapped record keys the cache holds now (a count, for tests and metrics)."""
        with self._cache_lock:
            return self._record_cached

    def _unwrap_ring(
        self, ring: RingRef, prefix: bytes, value: bytes, epoch: int
    ) -> tuple[int, _Key]:
        """Return the generation and unwrapped key of a ring entry, via the cache.

        Args:
            ring: The ring.
            prefix: Its LMDB key.
            value: Its stored 81-byte value.
            epoch: The cache epoch read before the transaction that read `value` began.

        Raises:
            KeyNotFoundError: If the KEK version that wrapped it is unavailable.
            IntegrityError: If the entry is malformed or fails to authenticate.
        """
        if len(value) != _RING_VALUE_SIZE:
            raise IntegrityError("malformed ring entry")
        generation: int = struct.unpack_from(">I", value)[0]
        cache_key = (prefix, bytes(value))
        with self._cache_lock:
            cached = self._cache.get(cache_key)
            if cached is not None:
                self._cache.move_to_end(cache_key)
                return generation, cached
        ring_key = self._kek._unwrap(_ring_ad_builder(ring, generation), bytes(value[4:]))
        self._cache_put(prefix, bytes(value), ring_key, epoch)
        return generation, ring_key

    def _cache_put(self, prefix: bytes, value: bytes, ring_key: _Key, epoch: int) -> None:
        """Cache an unwrapped ring key unless a destroy happened since `epoch` was read.

        The cache key includes the stored wrapped value, so an entry of a destroyed ring can
        never serve a ring re-created under the same name. The epoch check keeps a reader
        whose snapshot predates a destroy from re-inserting the destroyed key after eviction.
        """
        with self._cache_lock:
            if epoch != self._epoch:
                return
            self._cache[(prefix, value)] = ring_key
            self._cache.move_to_end((prefix, value))
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)


def _prefixed(
    txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes
) -> Iterator[tuple[bytes, bytes]]:
    """``(key, value)`` of every entry of `db` whose key starts with `prefix`."""
    cursor = txn.cursor(db=db)
    if not cursor.set_range(prefix):
        return
    for key, value in cursor:
        if not bytes(key).startswith(prefix):
            return
        yield bytes(key), bytes(value)


def _delete_prefix(txn: lmdb.Transaction, db: lmdb._Database, prefix: bytes) -> int:
    """Delete every entry of `db` whose key starts with `prefix`; return how many."""
    deleted = 0
    cursor = txn.cursor(db=db)
    if not cursor.set_range(prefix):
        return 0
    while bytes(cursor.key()).startswith(prefix):
        if not cursor.delete():
            break
        deleted += 1
    return deleted


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
