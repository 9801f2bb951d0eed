"""AEAD primitives, associated data and key holders.

Every encryption in `shredder` is XChaCha20-Poly1305 (IETF construction, libsodium's
``crypto_aead_xchacha20poly1305_ietf_*`` through PyNaCl's bindings, the functions
`nacl.secret.Aead` wraps; called directly they cost half as much per payload, which every
appended turn and every search hit pays; a payload is opened through the cffi module under
those bindings, `nacl._sodium`, without their argument checks and slice copies: 3.0 µs
instead of 5.6):
32-byte key, random 24-byte nonce drawn from the OS for every message (never a counter, which
a restored backup would roll back), 16-byte Poly1305 tag.

Byte layouts written by this module:

Payload ciphertext (`_seal_payload`), ``len(plaintext) + 41`` bytes::

    offset  size  field
    0       1     format version, 0x01
    1       24    nonce, random
    25      n     XChaCha20 ciphertext of the n-byte plaintext
    25+n    16    Poly1305 tag

    associated data = AssociatedData.encode()

Wrapped key (`_wrap_key`), always 77 bytes::

    offset  size  field
    0       1     format version, 0x01
    1       4     wrapping-key version, unsigned big-endian: the KEK version for a ring key,
                  the ring-key generation for a record key
    5       24    nonce, random
    29      32    XChaCha20 ciphertext of the 32-byte key
    61      16    Poly1305 tag

    associated data = the caller's encoded context (owner, ring, key id, kind, versions)

Encoded fields (`_encode_fields`, used for every associated data): a sequence of fields, each a
4-byte unsigned big-endian length followed by that many bytes. Strings are UTF-8; integers are
8 bytes unsigned big-endian. The first field is always a format tag naming the kind of data.
Every field delimits itself, so ``("ab", "c")`` and ``("a", "bc")`` encode differently.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import NoReturn

import nacl.exceptions
import nacl.utils

# The cffi module nacl.bindings wraps (see the module docstring and `_open_payload`).
from nacl._sodium import ffi as _ffi
from nacl._sodium import lib as _lib
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_decrypt as _aead_decrypt,
)
from nacl.bindings import (
    crypto_aead_xchacha20poly1305_ietf_encrypt as _aead_encrypt,
)

from shredder.errors import IntegrityError

KEY_SIZE = 32
"""Size of every key (KEK, ring key, record key), in bytes."""
NONCE_SIZE = 24
"""Size of an XChaCha20-Poly1305 nonce, in bytes."""
TAG_SIZE = 16
"""Size of a Poly1305 tag, in bytes."""

_PAYLOAD_FORMAT = 0x01
_PAYLOAD_OVERHEAD = 1 + NONCE_SIZE + TAG_SIZE  # 41 bytes
_WRAP_FORMAT = 0x01
WRAPPED_KEY_SIZE = 1 + 4 + NONCE_SIZE + KEY_SIZE + TAG_SIZE
"""Size of a wrapped key, in bytes (77)."""

_AD_TAG = "lethe-ad/1"
_LENGTH = struct.Struct(">I")
_AD_HEAD = _LENGTH.pack(len(_AD_TAG)) + _AD_TAG.encode()
_VERSION_HEAD = _LENGTH.pack(8)
_U32_MAX = 2**32 - 1
_U64_MAX = 2**64 - 1

ID_PATTERN = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
"""Owner and thread ids: 1 to 63 characters from ``[a-z0-9-]``, not starting with ``-``."""


def _check_id(kind: str, value: object) -> str:
    """Validate an owner or thread id.

    Args:
        kind: What the id names, for the error message ("owner", "thread").
        value: The id.

    Returns:
        The id, unchanged.

    Raises:
        ValueError: If `value` is not a str matching `ID_PATTERN`.
    """
    if not isinstance(value, str) or ID_PATTERN.fullmatch(value) is None:
        raise ValueError(f"invalid {kind} id: must match {ID_PATTERN.pattern}")
    return value


def _encode_fields(tag: str, *fields: str | int) -> bytes:
    """Encode a format tag and fields, each length-prefixed (see the module docstring).

    Args:
        tag: Format tag, written as the first field.
        *fields: Strings (UTF-8) or integers in ``[0, 2**64)`` (8 bytes, big-endian).

    Returns:
        The encoding.

    Raises:
        ValueError: If an integer is out of range or a string is not encodable as UTF-8.
    """
    parts: list[bytes] = []
    for field in (tag, *fields):
        if type(field) is str:
            raw = field.encode("utf-8")
        elif isinstance(field, bool):
            raise ValueError("booleans are not encodable fields")
        elif isinstance(field, int):
            if not 0 <= field <= _U64_MAX:
                raise ValueError("integer field out of range [0, 2**64)")
            raw = field.to_bytes(8, "big")
        else:
            raw = field.encode("utf-8")
        parts.append(_LENGTH.pack(len(raw)))
        parts.append(raw)
    return b"".join(parts)


@dataclass(frozen=True)
class AssociatedData:
    """What a payload ciphertext is bound to; opening under any other value fails.

    Attributes:
        owner: Owner id.
        record_id: Id of the record (turn or memory) the payload belongs to.
        version: Record version, in ``[0, 2**64)``.
        payload_type: What the payload is, e.g. ``"text"`` or ``"embedding"``.
    """

    owner: str
    record_id: str
    version: int
    payload_type: str

    def __post_init__(self) -> None:
        """Validate field types.

        Raises:
            ValueError: If a field has the wrong type or `version` is out of range.
        """
        for name in ("owner", "record_id", "payload_type"):
            if not isinstance(getattr(self, name), str):
                raise ValueError(f"AssociatedData.{name} must be a str")
        if isinstance(self.version, bool) or not isinstance(self.version, int):
            raise ValueError("AssociatedData.version must be an int")
        if not 0 <= self.version <= _U64_MAX:
            raise ValueError("AssociatedData.version out of range [0, 2**64)")

    def encode(self) -> bytes:
        """Encode as the AEAD associated data.

        Layout: fields ``"lethe-ad/1"``, owner, record_id, version (8 bytes), payload_type,
        each preceded by its 4-byte big-endian length in bytes.

        Returns:
            The encoding; distinct values always give distinct encodings.

        Raises:
            ValueError: If a string is not encodable as UTF-8 (lone surrogates).
        """
        # _encode_fields(_AD_TAG, owner, record_id, version, payload_type), spelled
        # out: every search hit encodes one (0.4 µs instead of 1.1).
        owner = self.owner.encode("utf-8")
        record_id = self.record_id.encode("utf-8")
        payload_type = self.payload_type.encode("utf-8")
        return b"".join(
            (
                _AD_HEAD,
                _LENGTH.pack(len(owner)),
                owner,
                _LENGTH.pack(len(record_id)),
                record_id,
                _VERSION_HEAD,
                self.version.to_bytes(8, "big"),
                _LENGTH.pack(len(payload_type)),
                payload_type,
            )
        )


@dataclass(frozen=True)
class RingRef:
    """Names a ring: a thread's ring, or the owner's ring when `thread` is None.

    Attributes:
        owner: Owner id, matching `ID_PATTERN`.
        thread: Thread id matching `ID_PATTERN`, or None for the owner's ring (derivatives
            that span threads).
    """

    owner: str
    thread: str | None = None

    def __post_init__(self) -> None:
        """Validate the ids.

        Raises:
            ValueError: If `owner` or `thread` does not match `ID_PATTERN`.
        """
        _check_id("owner", self.owner)
        if self.thread is not None:
            _check_id("thread", self.thread)


class _Key:
    """Holds 32 bytes of raw key material.

    Never printed (repr and str show ``<_Key redacted>``), refuses pickling and copying, and
    compares by identity only.
    """

    __slots__ = ("_material",)

    def __init__(self, material: bytes) -> None:
        """Wrap key material.

        Args:
            material: Exactly 32 bytes.

        Raises:
            ValueError: If `material` is not 32 bytes.
        """
        if not isinstance(material, bytes) or len(material) != KEY_SIZE:
            raise ValueError(f"key material must be {KEY_SIZE} bytes")
        self._material = material

    @classmethod
    def generate(cls) -> _Key:
        """Return a new key of 32 random bytes from the OS CSPRNG."""
        return cls(nacl.utils.random(KEY_SIZE))

    def __repr__(self) -> str:
        return "<_Key redacted>"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("key material cannot be pickled")

    def __getstate__(self) -> NoReturn:
        raise TypeError("key material cannot be pickled")


def _seal_payload(key: _Key, ad: bytes, plaintext: bytes) -> bytes:
    """Encrypt a payload under a record key (layout in the module docstring).

    Args:
        key: The record key.
        ad: Encoded associated data.
        plaintext: Bytes to encrypt, any length.

    Returns:
        ``len(plaintext) + 41`` bytes: format byte, 24-byte nonce, ciphertext, 16-byte tag.
    """
    nonce = nacl.utils.random(NONCE_SIZE)
    return bytes((_PAYLOAD_FORMAT,)) + nonce + _aead_encrypt(plaintext, ad, nonce, key._material)


def _open_payload(key: _Key, ad: bytes, ciphertext: bytes | bytearray | memoryview) -> bytes:
    """Decrypt and authenticate a payload sealed by `_seal_payload`.

    Args:
        key: The record key.
        ad: Encoded associated data; must equal the one sealed with.
        ciphertext: Output of `_seal_payload`, in any contiguous or strided buffer
            (bytes are read in place; anything else is copied first).

    Returns:
        The plaintext.

    Raises:
        IntegrityError: If `ciphertext` is shorter than 41 bytes, has an unknown format byte,
            or fails authentication (tampering, other associated data, other key).
    """
    if len(ciphertext) < _PAYLOAD_OVERHEAD:
        raise IntegrityError("ciphertext too short")
    if ciphertext[0] != _PAYLOAD_FORMAT:
        raise IntegrityError("unknown ciphertext format version")
    # libsodium's crypto_aead_xchacha20poly1305_ietf_decrypt on the nonce and
    # ciphertext in place (pointers into `ciphertext`, no slices copied). It
    # checks the tag, then reads the ciphertext again to decrypt it, without the
    # GIL: a buffer another thread may change meanwhile (a bytearray, a
    # memoryview) is copied first, or plaintext that was never authenticated
    # could come back. Stored payloads are bytes: no copy.
    if type(ciphertext) is not bytes:
        ciphertext = bytes(ciphertext)
    sealed = _ffi.from_buffer("unsigned char[]", ciphertext)
    size = len(ciphertext) - _PAYLOAD_OVERHEAD
    out = _ffi.new("unsigned char[]", size)
    failed = _lib.crypto_aead_xchacha20poly1305_ietf_decrypt(
        out,
        _ffi.NULL,
        _ffi.NULL,
        sealed + 1 + NONCE_SIZE,
        size + TAG_SIZE,
        ad,
        len(ad),
        sealed + 1,
        key._material,
    )
    if failed:
        raise IntegrityError("ciphertext failed authentication")
    plain: bytes = _ffi.buffer(out, size)[:]
    return plain


def _wrap_key(wrapping: _Key, wrapping_version: int, ad: bytes, key: _Key) -> bytes:
    """Encrypt a key under another key (layout in the module docstring).

    Args:
        wrapping: The key-encryption key (a KEK version or a ring key).
        wrapping_version: KEK version or ring-key generation, in ``[0, 2**32)``; written in
            clear into the result and expected to be part of `ad` too.
        ad: Encoded associated data naming the wrapped key's context.
        key: The key to wrap.

    Returns:
        77 bytes.

    Raises:
        ValueError: If `wrapping_version` is out of range.
    """
    if not 0 <= wrapping_version <= _U32_MAX:
        raise ValueError("wrapping version out of range [0, 2**32)")
    nonce = nacl.utils.random(NONCE_SIZE)
    sealed = _aead_encrypt(key._material, ad, nonce, wrapping._material)
    return struct.pack(">BI", _WRAP_FORMAT, wrapping_version) + nonce + sealed


def _wrapped_version(wrapped: bytes) -> int:
    """Read the wrapping-key version from a wrapped key.

    Args:
        wrapped: Output of `_wrap_key`.

    Returns:
        The KEK version or ring-key generation written at bytes 1..4.

    Raises:
        IntegrityError: If `wrapped` is not 77 bytes or has an unknown format byte.
    """
    if len(wrapped) != WRAPPED_KEY_SIZE or wrapped[0] != _WRAP_FORMAT:
        raise IntegrityError("malformed wrapped key")
    version: int = struct.unpack_from(">I", wrapped, 1)[0]
    return version


def _unwrap_key(wrapping: _Key, ad: bytes, wrapped: bytes) -> _Key:
    """Decrypt a key wrapped by `_wrap_key`.

    Args:
        wrapping: The key-encryption key.
        ad: Encoded associated data; must equal the one wrapped with.
        wrapped: 77 bytes from `_wrap_key`.

    Returns:
        The unwrapped key.

    Raises:
        IntegrityError: If `wrapped` is malformed or fails authentication.
    """
    _wrapped_version(wrapped)
    try:
        raw = bytes(wrapped)
        material = _aead_decrypt(
            raw[5 + NONCE_SIZE :], ad, raw[5 : 5 + NONCE_SIZE], wrapping._material
        )
    except nacl.exceptions.CryptoError:
        raise IntegrityError("wrapped key failed authentication") from None
    return _Key(material)
