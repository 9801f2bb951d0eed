"""The store's signing keys: made once, rotated, re-wrapped by a KEK rotation, destroyed by it."""

from __future__ import annotations

import shutil
from pathlib import Path

import lmdb
import nacl.exceptions
import nacl.signing
import pytest

from shredder import CryptoError, KekRing, KeyNotFoundError, Keystore, signing_key_id

MESSAGE = b"lethe-test/1\x00a statement"


def _message(key_id: str) -> bytes:
    assert len(key_id) == 16
    return MESSAGE


def _verify(public: bytes, message: bytes, signature: bytes) -> None:
    nacl.signing.VerifyKey(public).verify(message, signature)


def test_the_first_key_is_made_once_and_signs_what_its_public_key_verifies(
    tmp_path: Path,
) -> None:
    with Keystore(tmp_path / "ks", KekRing.from_env(KekRing.generate_env_value())) as ks:
        with pytest.raises(KeyNotFoundError):
            ks.sign(_message)
        assert ks.signing_keys() == []
        key_id = ks.ensure_signing_key()
        assert ks.ensure_signing_key() == key_id
        [info] = ks.signing_keys()
        assert (info.key_id, info.retire_time) == (key_id, 0.0)
        assert signing_key_id(info.public_key) == key_id
        assert len(key_id) == 16
        signed_by, signature = ks.sign(_message)
        assert signed_by == key_id
        assert len(signature) == 64
        _verify(info.public_key, MESSAGE, signature)
        with pytest.raises(nacl.exceptions.BadSignatureError):
            _verify(info.public_key, MESSAGE + b"!", signature)


def test_a_rotated_key_stays_published_and_its_old_signatures_verify(tmp_path: Path) -> None:
    with Keystore(tmp_path / "ks", KekRing.from_env(KekRing.generate_env_value())) as ks:
        first = ks.ensure_signing_key()
        _, old_signature = ks.sign(_message)
        assert ks.unrotated_since() is None
        new, retired = ks.rotate_signing_key()
        assert retired == first
        assert new != first
        assert ks.unrotated_since() is not None  # the next KEK rotation completes the shred
        keys = {info.key_id: info for info in ks.signing_keys()}
        assert set(keys) == {first, new}
        assert keys[first].retire_time >= keys[first].create_time > 0
        assert keys[new].retire_time == 0.0
        _verify(keys[first].public_key, MESSAGE, old_signature)
        signed_by, signature = ks.sign(_message)
        assert signed_by == new
        _verify(keys[new].public_key, MESSAGE, signature)
        with pytest.raises(nacl.exceptions.BadSignatureError):
            _verify(keys[first].public_key, MESSAGE, signature)


def test_a_kek_rotation_rewraps_the_key_and_destroys_a_retired_one_everywhere(
    tmp_path: Path,
) -> None:
    kek_path = tmp_path / "config" / "kek.json"
    kek = KekRing.load_or_create(kek_path, create=True)
    ks_path = tmp_path / "ks"
    with Keystore(ks_path, kek) as ks:
        first = ks.ensure_signing_key()
        assert ks.kek_version_in_use() == {1}  # no ring yet: the seed alone holds version 1
    snapshot = tmp_path / "snapshot"
    shutil.copytree(ks_path, snapshot)  # what a free page or an old copy would hold
    with Keystore(snapshot, kek) as old:
        assert old.sign(_message)[0] == first  # before the rotations the copy still signs
    with Keystore(ks_path, kek) as ks:
        second, _ = ks.rotate_signing_key()
        assert ks.rotate() == (0, 0, [1])
        assert ks.kek_version_in_use() == {2}
        assert ks.sign(_message)[0] == second
    reloaded = KekRing.load_or_create(kek_path, create=False)
    assert reloaded.versions == frozenset({2})
    with Keystore(snapshot, reloaded) as old, pytest.raises(CryptoError):
        old.sign(_message)
    with Keystore(ks_path, reloaded) as ks:
        assert ks.sign(_message)[0] == second
        assert [info.key_id for info in ks.signing_keys()] == [first, second]


def test_another_keystore_cannot_open_the_wrapped_key(tmp_path: Path) -> None:
    """The wrapped seed is bound to its keystore's id (associated data)."""
    kek = KekRing.from_env(KekRing.generate_env_value())
    with Keystore(tmp_path / "a", kek) as ks:
        ks.ensure_signing_key()
    with Keystore(tmp_path / "b", kek) as ks:
        ks.ensure_signing_key()
    # A copy of a's environment under b's id: a's wrapped seed, another store's id.
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    b_id = Keystore.read_store_id(tmp_path / "b")
    assert b_id is not None
    env = lmdb.open(str(tmp_path / "c"), max_dbs=8)
    meta = env.open_db(b"meta")
    with env.begin(write=True, db=meta) as txn:
        txn.put(b"store_id", b_id.encode())
    env.close()
    with Keystore(tmp_path / "c", kek) as ks, pytest.raises(CryptoError):
        ks.sign(_message)


def test_a_rotation_cut_after_the_new_kek_version_keeps_the_version_that_wraps_the_key(
    tmp_path: Path,
) -> None:
    """``keystore.rotate.after_kek``: the seed still wraps under the old version, kept in use."""
    kek_path = tmp_path / "config" / "kek.json"
    kek = KekRing.load_or_create(kek_path, create=True)
    with Keystore(tmp_path / "ks", kek) as ks:
        first = ks.ensure_signing_key()
        kek.add_version()  # what a crash at keystore.rotate.after_kek leaves
        assert ks.retire_unused_kek_versions() == []  # version 1 wraps the seed: in use
        assert ks.sign(_message)[0] == first
        assert ks.rotate() == (0, 0, [1, 2])
        assert ks.kek_version_in_use() == {3}
        assert ks.sign(_message)[0] == first
