"""Rotation: completing every shred cryptographically, and the KEK versions in use.

`RotationPart.rotate` is phase 2 of ARCHITECTURE.md, "Keys and crypto-shredding": every ring
that lost or gave away a record key gets a new ring key, and every ring key moves to a new KEK
version before the older versions are destroyed. Its failpoints mark the two moments a crash
can cut it at: ``keystore.rotate.after_kek`` (a new KEK version is in the KEK file, the
keystore not re-wrapped) and ``keystore.rotate.after_rewrap`` (ring keys re-wrapped, older KEK
versions not destroyed); `RotationPart.retire_unused_kek_versions` finishes the second.

Thread rules: `rotate` and `retire_unused_kek_versions` write (the keystore, the KEK file) and
must be called from one thread at a time (the server runs a rotation on its single writer
thread). `unrotated_since` and `kek_version_in_use` are safe from any number of threads
concurrently and never wait for the writer.
"""

from __future__ import annotations

import struct

from shredder._aead import _Key, _unwrap_key, _wrap_key, _wrapped_version
from shredder._failpoints import declare, failpoint
from shredder._keystore_base import KeystoreBase
from shredder._keystore_schema import (
    _KEK_CURRENT,
    _RING_VALUE_SIZE,
    _UNROTATED,
    _decode_ring_prefix,
    _record_ad,
    _ring_ad_builder,
)
from shredder._keystore_signing import rewrap_signing_seed, signing_kek_version
from shredder.errors import IntegrityError

__all__ = ["RotationPart"]

FP_ROTATE_AFTER_KEK = declare(
    "keystore.rotate.after_kek",
    "a new KEK version is in the KEK file; the keystore is not re-wrapped",
)
FP_ROTATE_AFTER_KEYSTORE = declare(
    "keystore.rotate.after_rewrap",
    "ring keys are re-wrapped under the new KEK version; older versions are not destroyed",
)


class RotationPart(KeystoreBase):
    """Rotation and the KEK versions in use (see the module docstring)."""

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
           ring key, and the signing key's seed (`shredder._keystore_signing`),
           is re-wrapped under the new KEK version.
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
            rewrap_signing_seed(txn, self._meta, self._kek, self._store_id)
            # Other processes sharing the store wrap new keys under it from now on.
            txn.put(_KEK_CURRENT, str(self._kek.current_version).encode(), db=self._meta)
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

    def kek_version_in_use(self) -> set[int]:
        """Return the KEK versions that wrap live ring keys or the signing key's seed.

        Raises:
            IntegrityError: If a stored ring entry is malformed.
        """
        versions: set[int] = set()
        with self._env.begin() as txn:
            for value in txn.cursor(db=self._rings).iternext(keys=False, values=True):
                if len(value) != _RING_VALUE_SIZE:
                    raise IntegrityError("malformed ring entry")
                versions.add(_wrapped_version(value[4:]))
            signing = signing_kek_version(txn, self._meta)
        if signing is not None:
            versions.add(signing)
        return versions
