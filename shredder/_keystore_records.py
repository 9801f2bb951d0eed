"""Record keys: creating them, moving them between rings, and listing them.

`RecordKeysPart` creates a batch of record keys (and every ring they need) in one synced
transaction and hands them back as `FreshKeys`, so the writer seals the batch's payloads
without unwrapping each key again; moves record keys to another ring (sealing turns into a
repair thread re-wraps their keys, the ciphertext stays as it is); and answers which record
keys exist.

Thread rules: `create_record_keys` and `rewrap_record_keys` are writes and must be called from
one thread at a time (the server calls them only from its single writer thread), since an LMDB
write transaction is bound to the thread that began it. `has_record_key`, `list_record_keys`,
`find_record_key` and `key_count` are safe from any number of threads concurrently and never
wait for the writer.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NoReturn

from shredder._aead import AssociatedData, RingRef, _Key, _seal_payload, _unwrap_key, _wrap_key
from shredder._keystore_base import KeystoreBase
from shredder._keystore_schema import (
    _FIRST_GENERATION,
    _decode_ring_prefix,
    _key_id_bytes,
    _owner_prefix,
    _record_ad,
    _record_lmdb_key,
    _ring_ad_builder,
    _ring_prefix,
    _ring_prefix_length,
)
from shredder.errors import KeyExistsError, KeyNotFoundError

__all__ = ["FreshKeys", "RecordKeysPart"]


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


class RecordKeysPart(KeystoreBase):
    """Creating, moving and listing record keys (see the module docstring)."""

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
                        value = struct.pack(">I", generation) + self._kek_to_wrap(txn)._wrap(
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
                value = struct.pack(">I", to_generation) + self._kek_to_wrap(txn)._wrap(
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

    def key_count(self) -> int:
        """Return the number of live wrapped keys: record keys plus ring keys."""
        with self._env.begin() as txn:
            return int(txn.stat(self._rings)["entries"] + txn.stat(self._records)["entries"])
