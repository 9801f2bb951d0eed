r"""Sealed bundles: rows that travel between shards, readable only by the destination.

Moving an owner between shards (``lethe owner export`` / ``import``) carries
its rows and its ring keys from one keystore to another. Neither may appear in
plaintext on disk or on the wire, and only the destination may open them, so
the destination makes a **receive key** (an X25519 key pair, as in age or a
KMS's import wrapping key) and gives its public half to the source; the source
seals the bundle to it with libsodium's sealed box
(``crypto_box_seal``: an ephemeral X25519 key agreement, then
XSalsa20-Poly1305; `nacl.public.SealedBox`). A sealed box authenticates its
contents against change in transit, but not who sealed them: anyone holding
the public half can make a bundle, so the receive key is handed only to the
source, and the import is an operator's deliberate act.

A bundle's plaintext is a sequence of entries, each three length-prefixed
byte strings ``(tag, key, value)``::

    b"lethe-bundle/1\n" | entry* ;  entry = (u32 BE length | bytes) x 3

A receive key file holds the 32-byte private key as 64 hex characters and a
newline, mode 0600, written once (never overwritten).

Thread rules: pure functions.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import nacl.exceptions
import nacl.public

from shredder.errors import EnvironmentConfigError, IntegrityError

__all__ = ["ReceiveKey", "open_bundle", "seal_bundle"]

_MAGIC = b"lethe-bundle/1\n"
_LEN = struct.Struct(">I")


class ReceiveKey:
    """The destination's key pair for sealed bundles (X25519).

    Args:
        private: the 32-byte private key.

    Raises:
        ValueError: ``private`` is not 32 bytes.
    """

    def __init__(self, private: bytes) -> None:
        if len(private) != 32:
            raise ValueError("a receive key is 32 bytes")
        self._private = nacl.public.PrivateKey(private)

    @classmethod
    def generate(cls) -> ReceiveKey:
        """A new random key pair."""
        return cls(bytes(nacl.public.PrivateKey.generate()))

    @property
    def public_hex(self) -> str:
        """The public half, 64 hex characters (what the source seals to)."""
        return bytes(self._private.public_key).hex()

    def save(self, path: Path) -> None:
        """Write the private key to a new file, mode 0600, synced.

        Raises:
            FileExistsError: ``path`` exists (a receive key is never overwritten).
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, bytes(self._private).hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def load(cls, path: Path) -> ReceiveKey:
        """Read a key written by :meth:`save`.

        Raises:
            EnvironmentConfigError: the file is not a receive key, or others may read it.
        """
        if path.stat().st_mode & 0o077:
            raise EnvironmentConfigError(f"{path} is readable by others (chmod 600 it)")
        try:
            return cls(bytes.fromhex(path.read_text().strip()))
        except ValueError as exc:
            raise EnvironmentConfigError(f"{path} is not a receive key") from exc

    def open(self, sealed: bytes) -> bytes:
        """The plaintext of a sealed box made for this key.

        Raises:
            IntegrityError: it was sealed to another key, or changed.
        """
        try:
            return bytes(nacl.public.SealedBox(self._private).decrypt(sealed))
        except nacl.exceptions.CryptoError as exc:
            raise IntegrityError(
                "the bundle was sealed to another receive key, or changed"
            ) from exc

    def __repr__(self) -> str:
        return f"ReceiveKey(public={self.public_hex[:16]}…)"


def seal_bundle(entries: Iterable[tuple[bytes, bytes, bytes]], recipient_hex: str) -> bytes:
    """Seal ``(tag, key, value)`` entries to a receive key's public half.

    Args:
        entries: the rows, in the order :func:`open_bundle` gives them back.
        recipient_hex: :attr:`ReceiveKey.public_hex` of the destination.

    Raises:
        ValueError: ``recipient_hex`` is not 64 hex characters.
    """
    try:
        public = nacl.public.PublicKey(bytes.fromhex(recipient_hex))
    except (ValueError, TypeError, nacl.exceptions.CryptoError) as exc:
        raise ValueError("a recipient is a receive key's 64-hex-character public half") from exc
    parts = [_MAGIC]
    for entry in entries:
        for field in entry:
            parts.append(_LEN.pack(len(field)))
            parts.append(field)
    return bytes(nacl.public.SealedBox(public).encrypt(b"".join(parts)))


def open_bundle(sealed: bytes, key: ReceiveKey) -> Iterator[tuple[bytes, bytes, bytes]]:
    """The entries of a bundle sealed by :func:`seal_bundle` to ``key``.

    Raises:
        IntegrityError: sealed to another key, changed, or not a bundle.
    """
    plain = memoryview(key.open(sealed))
    if bytes(plain[: len(_MAGIC)]) != _MAGIC:
        raise IntegrityError("not a lethe bundle")
    at, end = len(_MAGIC), len(plain)
    while at < end:
        fields = []
        for _ in range(3):
            if at + 4 > end:
                raise IntegrityError("truncated bundle")
            (size,) = _LEN.unpack_from(plain, at)
            at += 4
            if at + size > end:
                raise IntegrityError("truncated bundle")
            fields.append(bytes(plain[at : at + size]))
            at += size
        yield fields[0], fields[1], fields[2]
