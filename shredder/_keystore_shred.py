"""Destroying keys (the logical shred) and the shred log.

`ShredPart.destroy` is phase 1 of ARCHITECTURE.md, "Keys and crypto-shredding": record keys,
whole rings or every ring of an owner are deleted in one write transaction, recorded in the
shred log (ids and times only), and synced; a ring that lost a record key is marked for
renewal by the next rotation (`shredder._keystore_rotation`, phase 2); every unwrapped copy of
a destroyed key leaves memory before it returns. `ShredPart.shredded_at` reads the shred log,
so start-up can tell a key destroyed on purpose from one that went missing.

Thread rules: `destroy` is a write and must be called from one thread at a time (the server
calls it only from its single writer thread). `shredded_at` is safe from any number of threads
concurrently and never waits for the writer.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from shredder._aead import RingRef
from shredder._keystore_base import KeystoreBase
from shredder._keystore_schema import (
    _delete_prefix,
    _key_id_bytes,
    _key_id_log_key,
    _owner_prefix,
    _record_lmdb_key,
    _ring_prefix,
)

__all__ = ["ShredPart"]


class ShredPart(KeystoreBase):
    """Destroying keys and reading the shred log (see the module docstring)."""

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
