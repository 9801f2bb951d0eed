"""The stored byte layouts do not change when the AEAD calls do.

A payload and a wrapped key sealed by the code before it called libsodium's
bindings directly (it went through `nacl.secret.Aead`) still open, and new ones
have the same layout (the module docstring of `shredder._aead`).
"""

from __future__ import annotations

import pytest

from shredder._aead import _Key, _open_payload, _seal_payload, _unwrap_key, _wrap_key
from shredder.errors import IntegrityError

# Made with nacl.secret.Aead: key b"k" * 32, associated data b"ad" / b"ad2".
PAYLOAD = bytes.fromhex(
    "01f1e8a04b449a18a8a8b0960437cb321f2e4f3b59ca1fa23b08b93903854826c90f2b323054a8d22022f7535c93"
)
WRAPPED = bytes.fromhex(
    "0100000003ba782a49f1caaaa93c1d3114b7ac64170df17c597342496be8eff40cd8b9d62d31016bba971e6dfe0ea51f8ca753d475a8041ac24dadc9b00ba094e7ba75aa0989ccdd9f1c12f4ea"
)
KEY = _Key(b"k" * 32)


def test_a_payload_sealed_through_nacl_secret_still_opens() -> None:
    assert _open_payload(KEY, b"ad", PAYLOAD) == b"hello"


def test_a_key_wrapped_through_nacl_secret_still_unwraps() -> None:
    assert _unwrap_key(KEY, b"ad2", WRAPPED)._material == b"r" * 32


def test_new_ciphertexts_keep_the_layout() -> None:
    sealed = _seal_payload(KEY, b"ad", b"hello")
    assert len(sealed) == len(PAYLOAD) == 5 + 41
    assert sealed[0] == PAYLOAD[0] == 1
    assert sealed[1:25] != PAYLOAD[1:25]  # a fresh random nonce
    wrapped = _wrap_key(KEY, 3, b"ad2", _Key(b"r" * 32))
    assert wrapped[:5] == WRAPPED[:5] == bytes([1, 0, 0, 0, 3])
    assert len(wrapped) == 77


@pytest.mark.parametrize("flip", [0, 1, 24, 25, 45])
def test_a_changed_byte_fails_authentication(flip: int) -> None:
    bad = bytearray(PAYLOAD)
    bad[flip] ^= 1
    with pytest.raises(IntegrityError):
        _open_payload(KEY, b"ad", bytes(bad))
    with pytest.raises(IntegrityError):
        _open_payload(KEY, b"other", PAYLOAD)
