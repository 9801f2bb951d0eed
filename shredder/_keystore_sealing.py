"""Payloads under record keys: sealing, opening, keyed digests, and many at one snapshot.

`SealingPart` seals and opens payloads (ciphertext layout in `shredder._aead`) and makes keyed
digests under a record key held in the keystore; callers name the key by ring and key id and
never see it. `KeyReader` opens many payloads under one read snapshot (a search's hits, an
index build), unwrapping each record key once.

Thread rules: every method of `SealingPart` only reads, is safe from any number of threads
concurrently and never waits for the writer. A `KeyReader` is used and closed on the one
thread that made it (an LMDB read transaction is bound to the thread that began it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

import lmdb
import nacl.encoding
import nacl.hash

from shredder._aead import AssociatedData, RingRef, _Key, _open_payload, _seal_payload
from shredder._keystore_base import KeystoreBase

__all__ = ["KeyReader", "SealingPart"]


class KeyReader:
    """Opens many payloads under one keystore read transaction.

    :meth:`Keystore.open` begins a read transaction and unwraps the record key
    for every payload; a search that decrypts its hits, or an index build that
    decrypts every turn's content and vector (two payloads under one record
    key), pays that per payload. A reader holds one snapshot and keeps each
    record key it looked up until :meth:`close`, so each key is read once per
    reader (and unwrapped once while the keystore's bounded cache holds it: see
    ``KeystoreBase._record_key_in``). A key destroyed after the snapshot began
    still opens here, exactly as a
    :meth:`Keystore.open` that began before the destroy would; callers recheck
    visibility after opening, as they must anyway.

    Holds raw keys: never printed or pickled. Thread rules: one thread (an LMDB
    read transaction is bound to the thread that began it); close it on the
    same thread, before the keystore closes.
    """

    __slots__ = ("_epoch", "_keys", "_keystore", "_txn")

    def __init__(self, keystore: KeystoreBase) -> None:
        self._keystore = keystore
        self._epoch = keystore._epoch  # read before the snapshot: see KeystoreBase._cache_put
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


class SealingPart(KeystoreBase):
    """Sealing and opening payloads under record keys (see the module docstring)."""

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

    def keyed_digests(self, ring: RingRef, key_id: str, items: Sequence[bytes]) -> list[bytes]:
        """:meth:`keyed_digest` of each of ``items``, the key read and unwrapped once.

        An echo guard digests every word shingle of a write under its key; one
        lookup of the key serves them all.

        Returns:
            One 32-byte digest per item, in order.

        Raises:
            KeyNotFoundError: the record key or its ring does not exist.
            IntegrityError: a wrapped key fails to unwrap.
        """
        material = self._record_key(ring, key_id)._material
        return [
            nacl.hash.blake2b(
                data,
                digest_size=32,
                key=material,
                person=b"lethe-digest-v1",
                encoder=nacl.encoding.RawEncoder,
            )
            for data in items
        ]
