"""The store's signing keys: Ed25519 keys that sign what the store attests (deletion receipts).

The private half of the current signing key lives in the keystore, wrapped under the KEK like a
ring key, so it is never in the data environment nor in a data backup, and it is destroyed the
way a ring key is: deleted from the keystore (synced), then made unopenable everywhere by the
next KEK rotation (a lingering copy in a free page or a keystore snapshot is wrapped under a KEK
version that exists nowhere). The public halves of every key the store ever signed with stay
published, with when each was made and retired, so a receipt signed before a key rotation
still verifies after it.

A key's id is the first 8 bytes of the SHA-256 of its 32-byte public key, as 16 lowercase hex
characters: a verifier computes it from the public key it was given and picks the key a
signature names by it.

Layout, in the keystore's ``meta`` database (see `shredder._keystore_schema`)::

    b"signing/" | key id (16 ASCII hex)  ->  public key (32 bytes) | create time (8 bytes,
                                            IEEE 754 double, big-endian, seconds since the
                                            epoch) | retire time (8 bytes, as create time;
                                            0.0 while the key is current)
    b"signing_seed"                       ->  key id (16 ASCII hex) | the key's 32-byte Ed25519
                                            seed wrapped under the current KEK version (77
                                            bytes, layout in `shredder._aead`)

Associated data of the wrapped seed: ``"lethe-wrap/1", "signing", store id, key id, KEK
version``. A rotation of the KEK (`shredder._keystore_rotation`) re-wraps the seed in the same
transaction as the ring keys, and the seed's KEK version counts as in use.

Callers prefix what they sign with a domain of their own (``lethe-receipt/1`` and a NUL byte for
receipts), so a signature made for one purpose never verifies as another.

Thread rules: `ensure_signing_key` and `rotate_signing_key` write (one synced transaction each)
and must be called from one thread at a time per process; another process may write at the
same time (LMDB serialises the two; each decides inside its transaction). `sign` and
`signing_keys` are safe from any number of threads concurrently: `sign` reads the wrapped seed
in a read transaction on every call and unwraps it again only when it changed (a rotation of
the key or of the KEK, by this process or another).
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

import lmdb
import nacl.signing

from shredder._aead import WRAPPED_KEY_SIZE, _encode_fields, _Key, _wrapped_version
from shredder._kek import KekRing
from shredder._keystore_base import KeystoreBase
from shredder._keystore_schema import _WRAP_TAG
from shredder.errors import IntegrityError, KeyNotFoundError

__all__ = ["SigningKeyInfo", "SigningPart", "signing_key_id"]

_PUBLIC_PREFIX = b"signing/"
_SEED = b"signing_seed"
_KEY_ID_CHARS = 16
_PUBLIC = struct.Struct(">32sdd")


def signing_key_id(public_key: bytes) -> str:
    """The id of an Ed25519 public key: the first 8 bytes of its SHA-256, 16 hex characters."""
    return hashlib.sha256(public_key).hexdigest()[:_KEY_ID_CHARS]


@dataclass(frozen=True)
class SigningKeyInfo:
    """The public half of one signing key, as published.

    Attributes:
        key_id: 16 hex characters (:func:`signing_key_id` of ``public_key``).
        public_key: the 32-byte Ed25519 public key.
        create_time: when the key was made, seconds since the epoch.
        retire_time: when a newer key replaced it (its private half was destroyed then),
            seconds since the epoch; 0.0 for the current key.
    """

    key_id: str
    public_key: bytes
    create_time: float
    retire_time: float


class _Signer:
    """An unwrapped signing key; never printed, never pickled."""

    __slots__ = ("_key", "key_id", "wrapped")

    def __init__(self, key: nacl.signing.SigningKey, key_id: str, wrapped: bytes) -> None:
        self._key = key
        self.key_id = key_id
        self.wrapped = wrapped

    def sign(self, message: bytes) -> bytes:
        return bytes(self._key.sign(message).signature)

    def __repr__(self) -> str:
        return f"<signing key {self.key_id} redacted>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material cannot be pickled")


def _seed_ad(store_id: str, key_id: str) -> Callable[[int], bytes]:
    def build(kek_version: int) -> bytes:
        return _encode_fields(_WRAP_TAG, "signing", store_id, key_id, kek_version)

    return build


def _split_seed_entry(raw: bytes) -> tuple[str, bytes]:
    """``(key id, wrapped seed)`` of the ``signing_seed`` entry.

    Raises:
        IntegrityError: the entry is malformed.
    """
    if len(raw) != _KEY_ID_CHARS + WRAPPED_KEY_SIZE:
        raise IntegrityError("malformed signing key entry")
    return raw[:_KEY_ID_CHARS].decode("ascii"), raw[_KEY_ID_CHARS:]


def rewrap_signing_seed(
    txn: lmdb.Transaction, meta: lmdb._Database, kek: KekRing, store_id: str
) -> bool:
    """Re-wrap the current signing key's seed under the current KEK version, inside ``txn``.

    Called by a KEK rotation in its own transaction, after the new version became current
    and before the older ones are destroyed.

    Returns:
        Whether there was a seed to re-wrap.

    Raises:
        CryptoError: the seed fails to unwrap.
    """
    raw = txn.get(_SEED, db=meta)
    if raw is None:
        return False
    key_id, wrapped = _split_seed_entry(bytes(raw))
    build = _seed_ad(store_id, key_id)
    seed = kek._unwrap(build, wrapped)
    txn.put(_SEED, key_id.encode("ascii") + kek._wrap(build, seed), db=meta)
    return True


def signing_kek_version(txn: lmdb.Transaction, meta: lmdb._Database) -> int | None:
    """The KEK version that wraps the signing key's seed, or None when there is none.

    Raises:
        IntegrityError: the entry is malformed.
    """
    raw = txn.get(_SEED, db=meta)
    if raw is None:
        return None
    return _wrapped_version(_split_seed_entry(bytes(raw))[1])


class SigningPart(KeystoreBase):
    """The store's signing keys (see the module docstring)."""

    _signer_lock: threading.Lock
    _signer: _Signer | None

    def ensure_signing_key(self) -> str:
        """Make the first signing key unless there is one; returns the current key's id.

        Raises:
            lmdb.Error, OSError: the transaction failed (nothing is written).
        """
        with self._env.begin(write=True) as txn:
            raw = txn.get(_SEED, db=self._meta)
            if raw is not None:
                return _split_seed_entry(bytes(raw))[0]
            return self._new_signing_key(txn)

    def rotate_signing_key(self) -> tuple[str, str | None]:
        """Replace the current signing key with a new one, in one synced transaction.

        The old key's public half stays published with its retire time (receipts it signed
        keep verifying); its private half is deleted from the keystore, and the next KEK
        rotation makes any lingering copy of it unopenable (the keystore is marked as
        awaiting one).

        Returns:
            ``(the new key's id, the retired key's id or None when there was none)``.

        Raises:
            lmdb.Error, OSError: the transaction failed (nothing is changed).
        """
        with self._env.begin(write=True) as txn:
            raw = txn.get(_SEED, db=self._meta)
            old: str | None = None
            if raw is not None:
                old = _split_seed_entry(bytes(raw))[0]
                public = txn.get(_PUBLIC_PREFIX + old.encode("ascii"), db=self._meta)
                if public is None:
                    raise IntegrityError("the current signing key has no public record")
                key, created, _ = _PUBLIC.unpack(bytes(public))
                txn.put(
                    _PUBLIC_PREFIX + old.encode("ascii"),
                    _PUBLIC.pack(key, created, time.time()),
                    db=self._meta,
                )
                txn.delete(_SEED, db=self._meta)
                self._mark_unrotated(txn)
            new = self._new_signing_key(txn)
        self._env.sync(True)
        with self._signer_lock:
            self._signer = None
        return new, old

    def _new_signing_key(self, txn: lmdb.Transaction) -> str:
        seed = _Key.generate()
        public = bytes(nacl.signing.SigningKey(seed._material).verify_key.encode())
        key_id = signing_key_id(public)
        txn.put(
            _PUBLIC_PREFIX + key_id.encode("ascii"),
            _PUBLIC.pack(public, time.time(), 0.0),
            db=self._meta,
        )
        wrapped = self._kek_to_wrap(txn)._wrap(_seed_ad(self._store_id, key_id), seed)
        txn.put(_SEED, key_id.encode("ascii") + wrapped, db=self._meta)
        return key_id

    def sign(self, message: Callable[[str], bytes]) -> tuple[str, bytes]:
        """Sign with the current signing key what ``message`` builds for it.

        Args:
            message: given the current key's id, returns the bytes to sign (so that what is
                signed can name its key), starting with the caller's domain prefix.

        Returns:
            ``(key id, 64-byte Ed25519 signature)``.

        Raises:
            KeyNotFoundError: the keystore has no signing key (see `ensure_signing_key`),
                or the KEK version that wraps it is gone.
            IntegrityError: the stored seed fails to unwrap.
        """
        with self._env.begin() as txn:
            raw = txn.get(_SEED, db=self._meta)
            stored = None if raw is None else bytes(raw)
        if stored is None:
            raise KeyNotFoundError("the keystore has no signing key")
        signer = self._signer
        if signer is None or signer.wrapped != stored:
            key_id, wrapped = _split_seed_entry(stored)
            seed = self._kek._unwrap(_seed_ad(self._store_id, key_id), wrapped)
            signer = _Signer(nacl.signing.SigningKey(seed._material), key_id, stored)
            with self._signer_lock:
                self._signer = signer
        return signer.key_id, signer.sign(message(signer.key_id))

    def signing_keys(self) -> list[SigningKeyInfo]:
        """Every signing key's public half, oldest first (the current one has no retire time).

        Raises:
            IntegrityError: a stored entry is malformed.
        """
        out: list[SigningKeyInfo] = []
        with self._env.begin() as txn:
            cursor = txn.cursor(db=self._meta)
            if cursor.set_range(_PUBLIC_PREFIX):
                for raw_key, value in cursor:
                    key = bytes(raw_key)
                    if not key.startswith(_PUBLIC_PREFIX):
                        break
                    if len(value) != _PUBLIC.size:
                        raise IntegrityError("malformed signing key record")
                    public, created, retired = _PUBLIC.unpack(bytes(value))
                    key_id = key[len(_PUBLIC_PREFIX) :].decode("ascii")
                    if signing_key_id(public) != key_id:
                        raise IntegrityError("a signing key record names another key")
                    out.append(SigningKeyInfo(key_id, public, created, retired))
        out.sort(key=lambda info: (info.create_time, info.key_id))
        return out
