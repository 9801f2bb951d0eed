"""Sealed bundles and an owner's keys moving between two keystores with different KEKs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from shredder import (
    AssociatedData,
    EnvironmentConfigError,
    IntegrityError,
    KekRing,
    KeyExistsError,
    Keystore,
    ReceiveKey,
    RingRef,
    open_bundle,
    seal_bundle,
)

ALICE_T1 = RingRef("alice", "t1")
ALICE = RingRef("alice")
BOB_T1 = RingRef("bob", "t1")
AD = AssociatedData("alice", "owners/alice/threads/t1/turns/1", 1, "text")
SECRET = b"the heron nests by the old mill"


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Keystore, Keystore]]:
    source = Keystore(
        tmp_path / "a", KekRing.from_env(KekRing.generate_env_value()), map_size=1 << 24
    )
    dest = Keystore(
        tmp_path / "c", KekRing.from_env(KekRing.generate_env_value()), map_size=1 << 24
    )
    yield source, dest
    source.close()
    dest.close()


def test_a_bundle_opens_only_with_its_receive_key_and_unchanged() -> None:
    key, other = ReceiveKey.generate(), ReceiveKey.generate()
    entries = [(b"t", b"k1", b"v1"), (b"t", b"", b""), (b"u", b"k" * 300, os.urandom(70_000))]
    sealed = seal_bundle(entries, key.public_hex)
    assert list(open_bundle(sealed, key)) == entries
    assert SECRET not in seal_bundle([(b"t", b"k", SECRET)], key.public_hex)
    with pytest.raises(IntegrityError):
        list(open_bundle(sealed, other))
    flipped = bytearray(sealed)
    flipped[len(flipped) // 2] ^= 1
    with pytest.raises(IntegrityError):
        list(open_bundle(bytes(flipped), key))
    with pytest.raises(ValueError, match="64-hex"):
        seal_bundle(entries, "not hex")


def test_a_receive_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    key = ReceiveKey.generate()
    path = tmp_path / "c.key"
    key.save(path)
    assert path.stat().st_mode & 0o777 == 0o600
    assert ReceiveKey.load(path).public_hex == key.public_hex
    with pytest.raises(FileExistsError):
        ReceiveKey.generate().save(path)
    path.chmod(0o644)
    with pytest.raises(EnvironmentConfigError, match="readable by others"):
        ReceiveKey.load(path)


def test_an_owners_keys_move_to_a_keystore_with_another_kek(
    pair: tuple[Keystore, Keystore],
) -> None:
    source, dest = pair
    source.create_record_keys([(ALICE_T1, "k1"), (ALICE_T1, "k2"), (ALICE, "m1"), (BOB_T1, "b1")])
    sealed = source.seal(ALICE_T1, "k1", AD, SECRET)
    source.destroy(record_keys=[(ALICE_T1, "k2")])
    receive = ReceiveKey.generate()
    bundle, count = source.export_owner("alice", receive.public_hex)
    assert count == 2 + 2  # two rings, two live record keys; bob's are not in it
    assert dest.import_owner("alice", bundle, receive) == 4
    assert dest.open(ALICE_T1, "k1", AD, sealed) == SECRET
    assert set(dest.list_record_keys("alice")) == {(ALICE, "m1"), (ALICE_T1, "k1")}
    assert list(dest.list_record_keys("bob")) == []
    # The shred log moved too: k2 was destroyed on purpose, not lost.
    assert dest.shredded_at(ALICE_T1, "k2") is not None
    with pytest.raises(KeyExistsError):
        dest.import_owner("alice", bundle, receive)
    # The ring keys are wrapped under the destination's KEK: the source's KEK is not needed.
    assert dest.kek_version_in_use() == {dest._kek.current_version}


def test_a_key_bundle_for_another_owner_is_refused(pair: tuple[Keystore, Keystore]) -> None:
    source, dest = pair
    source.create_record_keys([(BOB_T1, "b1")])
    receive = ReceiveKey.generate()
    bundle, _ = source.export_owner("bob", receive.public_hex)
    with pytest.raises(IntegrityError, match="another owner"):
        dest.import_owner("alice", bundle, receive)
    assert list(dest.list_record_keys()) == []


def test_evict_owner_drops_only_that_owners_cached_keys(pair: tuple[Keystore, Keystore]) -> None:
    source, _ = pair
    source.create_record_keys([(ALICE_T1, "k1"), (BOB_T1, "b1")])
    bob_ad = AssociatedData("bob", "owners/bob/threads/t1/turns/1", 1, "text")
    alice_ct = source.seal(ALICE_T1, "k1", AD, SECRET)
    bob_ct = source.seal(BOB_T1, "b1", bob_ad, SECRET)
    source.open(ALICE_T1, "k1", AD, alice_ct)
    source.open(BOB_T1, "b1", bob_ad, bob_ct)
    held = source.cached_record_keys
    source.evict_owner("alice")
    assert source.cached_record_keys == held - 1
    assert source.open(BOB_T1, "b1", bob_ad, bob_ct) == SECRET
