"""The declared base of every part of the keystore, and the unwrap path they share.

`KeystoreBase` names what every part of `shredder.Keystore` may use: the environment, its
named databases (`shredder._keystore_schema`), the KEK ring and the caches of unwrapped keys.
It holds the helpers the parts share: unwrapping a ring key or a record key through those
caches, and marking when the oldest destruction not yet completed by a rotation happened. The
parts (`shredder._keystore_records`, `_keystore_sealing`, `_keystore_shred`,
`_keystore_rotation`, `_keystore_moves`) inherit it and `shredder._keystore` composes them
(chroma's ``chromadb/db/base.py``: mixins over a declared base, never over stubs).

Unwrapped ring keys are cached in memory (bounded LRU guarded by a lock) for the hot path that
decrypts search hits, and so are unwrapped record keys (bounded by `_RECORD_CACHE_SIZE` keys,
LRU over rings), each with the wrapped bytes it came from, which every call still reads from
its own transaction. Destroying a key or a ring evicts its cached keys, and a reader that raced
with the destroy cannot put them back (the cache has an epoch that every destroy advances).

Thread rules: the unwrap helpers (`_record_key`, `_record_key_in`, `_unwrap_ring`,
`_cache_put`) and `cached_record_keys` are safe from any number of threads concurrently: the
caches and the epoch change only under `_cache_lock`. `_mark_unrotated` runs inside a write
transaction, so on the one thread writing; `_clear_record_cache` only with `_cache_lock` held.
"""

from __future__ import annotations

import struct
import threading
import time
from collections import OrderedDict

import lmdb

from shredder._aead import RingRef, _Key, _unwrap_key, _wrapped_version
from shredder._kek import KekRing
from shredder._keystore_schema import (
    _KEK_CURRENT,
    _RING_VALUE_SIZE,
    _UNROTATED,
    _key_id_bytes,
    _record_ad,
    _ring_ad_builder,
    _ring_prefix,
)
from shredder.errors import IntegrityError, KeyNotFoundError

__all__ = ["KeystoreBase"]

_CACHE_SIZE = 65536
_RECORD_CACHE_SIZE = 32768
"""Most unwrapped record keys kept between calls (about 8 MiB): see KeystoreBase._record_key_in."""


class KeystoreBase:
    """Declared state and shared helpers of the keystore (see the module docstring)."""

    _kek: KekRing
    """The KEK ring that wraps ring keys."""
    _store_id: str
    """The keystore's random id (32 hex characters)."""
    _env: lmdb.Environment
    """The keystore environment."""
    # The named databases, one attribute each (layouts in `shredder._keystore_schema`).
    _rings: lmdb._Database
    _records: lmdb._Database
    _dirty: lmdb._Database
    _shredded: lmdb._Database
    _ledger: lmdb._Database
    _meta: lmdb._Database
    _cache_lock: threading.Lock
    """Held for every change of `_cache`, `_record_cache`, `_record_cached` and `_epoch`."""
    _cache: OrderedDict[tuple[bytes, bytes], _Key]
    """Unwrapped ring keys by ``(ring prefix, stored ring value)``, least recently used first."""
    _record_cache: OrderedDict[bytes, dict[bytes, tuple[bytes, _Key]]]
    """Unwrapped record keys by ring prefix (LRU over rings), then by their LMDB key, with the
    wrapped value each came from: see `_record_key_in`."""
    _record_cached: int
    """How many record keys `_record_cache` holds, over every ring."""
    _epoch: int
    """Advanced whenever cached keys may have to go (destroy, rewrap, rotation, eviction,
    close): see `_cache_put`."""

    def _kek_to_wrap(self, txn: lmdb.Transaction) -> KekRing:
        """The KEK ring to wrap a new ring key with, inside the write transaction ``txn``.

        Processes sharing a store each hold the KEK ring; the one that rotates
        writes the new version to the KEK file, then records it in the
        keystore in the transaction that moves every ring key to it. A
        transaction that wraps a new key reads that record first (write
        transactions run one at a time across processes) and reads the file
        again if it is newer than this process's current version: a key
        wrapped before the rotation's transaction is moved by it, one wrapped
        after uses the new version, so no rotation retires a version a key
        still needs.
        """
        raw = txn.get(_KEK_CURRENT, db=self._meta)
        if raw is not None and int(bytes(raw)) > self._kek.current_version:
            self._kek.reload()
        return self._kek

    def _mark_unrotated(self, txn: lmdb.Transaction) -> None:
        """Record now in ``meta`` as the oldest destruction not yet rotated, unless one is there."""
        if txn.get(_UNROTATED, db=self._meta) is None:
            txn.put(_UNROTATED, repr(time.time()).encode(), db=self._meta)

    def _record_key(self, ring: RingRef, key_id: str) -> _Key:
        epoch = self._epoch  # read before the snapshot: see _cache_put
        with self._env.begin() as txn:
            return self._record_key_in(txn, ring, key_id, epoch)

    def _record_key_in(self, txn: lmdb.Transaction, ring: RingRef, key_id: str, epoch: int) -> _Key:
        """Unwrap a record key as seen by the read transaction ``txn``.

        ``epoch`` was read before ``txn`` began.

        The wrapped record key is read from ``txn`` on every call (and the ring entry
        when the unwrap is not cached), so a key destroyed before the snapshot never opens.
        What is cached (up to
        ``_RECORD_CACHE_SIZE`` keys, by ring, least recently used ring first out) is the
        unwrap: a key read again with the same wrapped bytes skips the two AEAD
        decryptions of ring and record key, the main per-hit cost of a search. The
        cache obeys the ring cache's rules: :meth:`Keystore.destroy` evicts what it destroys before
        it returns (a destroyed key leaves memory with the destroy, as ring keys do),
        rotation and :meth:`Keystore.close` clear it, and a reader whose snapshot predates a
        destroy never re-inserts (the epoch check).

        Raises:
            KeyNotFoundError, IntegrityError, ValueError: as :meth:`Keystore.open`.
        """
        prefix = _ring_prefix(ring)
        lmdb_key = prefix + _key_id_bytes(key_id)
        wrapped = txn.get(lmdb_key, db=self._records)
        if wrapped is None:
            if txn.get(prefix, db=self._rings) is None:
                raise KeyNotFoundError("ring does not exist")
            raise KeyNotFoundError("record key does not exist")
        wrapped = bytes(wrapped)
        # A record key's row exists only while its ring's does (:meth:`destroy`
        # deletes a ring with every record key under it, in one transaction):
        # a cached unwrap needs no read of the ring.
        with self._cache_lock:
            held = self._record_cache.get(prefix)
            hit = None if held is None else held.get(lmdb_key)
            if hit is not None and hit[0] == wrapped:
                self._record_cache.move_to_end(prefix)
                return hit[1]
        ring_value = txn.get(prefix, db=self._rings)
        if ring_value is None:
            raise KeyNotFoundError("ring does not exist")
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
