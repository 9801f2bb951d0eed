"""An owner's keys moving between keystores: export, import, and eviction from memory.

`MovesPart` exports every key of an owner sealed to a destination's receive key (layout in
`shredder._bundle`), imports such a bundle under this store's KEK, checks that this store's
KEK opens its rings, and drops an owner's cached keys when another process changed them. Ring
keys leave a keystore only inside the sealed bundle.

Thread rules: `import_owner` is a write and must be called from one thread at a time, like
every write of the keystore. `export_owner`, `kek_opens_rings` and `evict_owner` are safe from
any number of threads concurrently and never wait for the writer.
"""

from __future__ import annotations

import struct

from shredder._aead import RingRef, _Key, _unwrap_key
from shredder._bundle import ReceiveKey, open_bundle, seal_bundle
from shredder._keystore_base import KeystoreBase
from shredder._keystore_schema import (
    _decode_ring_prefix,
    _owner_prefix,
    _prefixed,
    _record_ad,
    _ring_ad_builder,
)
from shredder.errors import IntegrityError, KeyExistsError, KeyNotFoundError

__all__ = ["MovesPart"]


class MovesPart(KeystoreBase):
    """Exporting, importing and evicting an owner's keys (see the module docstring)."""

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
                value = struct.pack(">I", generation) + self._kek_to_wrap(txn)._wrap(
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

    def evict_cached(self) -> None:
        """Drop every cached unwrapped key from this process's memory.

        For when another process sharing the store rotated it: ring keys were
        renewed and KEK versions destroyed.
        """
        with self._cache_lock:
            self._epoch += 1
            self._cache.clear()
            self._clear_record_cache()

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
