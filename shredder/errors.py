"""Exceptions raised by `shredder`.

The tree::

    ShredderError                   base of everything this package raises on purpose
    ├── CryptoError                 every cryptographic failure, one type to catch
    │   ├── KeyNotFoundError        the record key or its ring does not exist
    │   │                           (destroyed, or never created)
    │   └── IntegrityError          AEAD authentication failed although the key exists
    │                               (tampered or malformed ciphertext, associated data
    │                               mismatch, wrong key or KEK)
    ├── KeyExistsError              a record key id is already taken (also a ValueError)
    └── EnvironmentConfigError      the deployment is unsafe or broken: LMDB flags, KEK
                                    file missing, malformed, readable by others or
                                    placed inside the data or backup paths

Messages never contain key material, plaintext or ciphertext.
"""

from __future__ import annotations

__all__ = [
    "CryptoError",
    "EnvironmentConfigError",
    "IntegrityError",
    "KeyExistsError",
    "KeyNotFoundError",
    "ShredderError",
]


class ShredderError(Exception):
    """Base class of every error `shredder` raises on purpose."""


class CryptoError(ShredderError):
    """A cryptographic operation failed. Catch this one type for every crypto failure."""


class KeyNotFoundError(CryptoError):
    """The record key, or the ring holding it, does not exist (destroyed or never created)."""


class IntegrityError(CryptoError):
    """AEAD authentication failed while the key exists.

    Raised for tampered, truncated or malformed ciphertext, associated data that does not
    match the data sealed with, or a wrong key (including a wrong KEK).
    """


class KeyExistsError(ShredderError, ValueError):
    """A record key id that is to be created already exists in its ring or in the batch."""


class EnvironmentConfigError(ShredderError):
    """The environment is misconfigured: LMDB flags, KEK file placement, mode or format."""
