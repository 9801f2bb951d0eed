"""Associated data encoding, ring references and key holders."""

from __future__ import annotations

import base64
import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shredder import AssociatedData, IntegrityError, RingRef
from shredder._aead import (
    _AD_TAG,
    WRAPPED_KEY_SIZE,
    _encode_fields,
    _Key,
    _open_payload,
    _seal_payload,
    _unwrap_key,
    _wrap_key,
    _wrapped_version,
)

_text = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=20)
_ads = st.builds(
    AssociatedData,
    owner=_text,
    record_id=_text,
    version=st.integers(min_value=0, max_value=2**64 - 1),
    payload_type=_text,
)


@given(_ads, _ads)
def test_associated_data_encoding_is_injective(a: AssociatedData, b: AssociatedData) -> None:
    assert (a.encode() == b.encode()) == (a == b)


@given(_ads)
def test_associated_data_encoding_is_the_field_encoding(ad: AssociatedData) -> None:
    """The spelled-out encoding equals the documented one, non-ASCII text included."""
    fields = (ad.owner, ad.record_id, ad.version, ad.payload_type)
    assert ad.encode() == _encode_fields(_AD_TAG, *fields)


@pytest.mark.parametrize("size", [0, 1, 300, 70_000])
def test_a_payload_opens_from_any_buffer_and_not_once_changed(size: int) -> None:
    key = _Key.generate()
    ad = AssociatedData("o", "r", 1, "content").encode()
    plain = bytes(range(256)) * (size // 256) + bytes(size % 256)
    sealed = _seal_payload(key, ad, plain)
    doubled = bytes(b for byte in sealed for b in (byte, 0))
    for form in (sealed, bytearray(sealed), memoryview(sealed), memoryview(doubled)[::2]):
        assert _open_payload(key, ad, form) == plain  # the last one not contiguous
    for at in (1, 25, len(sealed) - 1):  # nonce, ciphertext (or tag when empty), tag
        bad = bytearray(sealed)
        bad[at] ^= 1
        with pytest.raises(IntegrityError):
            _open_payload(key, ad, bytes(bad))
    with pytest.raises(IntegrityError):
        _open_payload(key, ad + b"x", sealed)


def test_associated_data_fields_do_not_run_together() -> None:
    one = AssociatedData("ab", "c", 1, "text")
    two = AssociatedData("a", "bc", 1, "text")
    assert one.encode() != two.encode()


def test_associated_data_encoding_is_length_prefixed() -> None:
    encoded = AssociatedData("o", "r", 7, "t").encode()
    assert encoded == (
        b"\x00\x00\x00\x0alethe-ad/1"
        b"\x00\x00\x00\x01o"
        b"\x00\x00\x00\x01r"
        b"\x00\x00\x00\x08\x00\x00\x00\x00\x00\x00\x00\x07"
        b"\x00\x00\x00\x01t"
    )


@pytest.mark.parametrize("version", [-1, 2**64, True])
def test_associated_data_with_bad_version_is_rejected(version: int) -> None:
    with pytest.raises(ValueError, match="version"):
        AssociatedData("o", "r", version, "t")


@pytest.mark.parametrize(
    ("owner", "thread"),
    [
        ("", None),
        ("A", None),
        ("-a", None),
        ("a\x00", None),
        ("a", ""),
        ("a", "t/1"),
        ("a" * 64, None),
    ],
)
def test_ring_ref_with_malformed_id_is_rejected(owner: str, thread: str | None) -> None:
    with pytest.raises(ValueError, match="invalid"):
        RingRef(owner, thread)


def test_ring_ref_accepts_valid_ids() -> None:
    assert RingRef("a" * 63, "0-t").thread == "0-t"
    assert RingRef("o").thread is None


def test_payload_round_trip_and_layout() -> None:
    key = _Key.generate()
    sealed = _seal_payload(key, b"ad", b"hello")
    assert len(sealed) == 1 + 24 + 5 + 16
    assert sealed[0] == 0x01
    assert b"hello" not in sealed
    assert _open_payload(key, b"ad", sealed) == b"hello"


def test_payload_nonces_are_random() -> None:
    key = _Key.generate()
    assert _seal_payload(key, b"", b"x")[1:25] != _seal_payload(key, b"", b"x")[1:25]


def test_open_payload_with_unknown_format_byte_fails() -> None:
    key = _Key.generate()
    sealed = _seal_payload(key, b"ad", b"hello")
    with pytest.raises(IntegrityError, match="format"):
        _open_payload(key, b"ad", b"\x02" + sealed[1:])


def test_wrapped_key_layout_and_round_trip() -> None:
    kek, key = _Key.generate(), _Key.generate()
    wrapped = _wrap_key(kek, 7, b"ctx", key)
    assert len(wrapped) == WRAPPED_KEY_SIZE == 77
    assert wrapped[:5] == b"\x01\x00\x00\x00\x07"
    assert _wrapped_version(wrapped) == 7
    assert key._material not in wrapped
    assert _unwrap_key(kek, b"ctx", wrapped)._material == key._material


def test_unwrap_with_other_context_fails() -> None:
    kek = _Key.generate()
    wrapped = _wrap_key(kek, 1, b"ctx", _Key.generate())
    with pytest.raises(IntegrityError):
        _unwrap_key(kek, b"other", wrapped)


def test_key_holder_pickling_fails() -> None:
    key = _Key.generate()
    with pytest.raises(TypeError):
        pickle.dumps(key)
    with pytest.raises(TypeError):
        copy.deepcopy(key)


def test_key_holder_repr_shows_no_material() -> None:
    key = _Key.generate()
    material = key._material
    shown = repr(key) + str(key) + f"{key}"
    assert shown == "<_Key redacted>" * 3
    for encoding in (
        material.hex(),
        base64.b64encode(material).decode(),
        base64.urlsafe_b64encode(material).decode(),
        repr(material),
    ):
        assert encoding not in shown


def test_key_holder_with_wrong_size_is_rejected() -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        _Key(b"\x00" * 31)


def test_a_buffer_changed_while_it_opens_never_gives_unauthenticated_plaintext() -> None:
    """Libsodium checks the tag, then reads the ciphertext again without the GIL.

    A thread flips a byte of the bytearray being opened all along: each open
    either fails or returns the sealed plaintext, never anything else (opened
    in place, 80 of 300 opens returned plaintext that was never authenticated).
    """
    import threading

    key = _Key.generate()
    ad = AssociatedData("o", "r", 1, "content").encode()
    plain = bytes(4 << 20)
    buf = bytearray(_seal_payload(key, ad, plain))
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            buf[1 << 20] ^= 1

    flipper = threading.Thread(target=flip)
    flipper.start()
    wrong = 0
    try:
        for _ in range(150):
            try:
                wrong += _open_payload(key, ad, buf) != plain
            except IntegrityError:
                continue
    finally:
        stop.set()
        flipper.join()
    assert wrong == 0
