"""Rotation: the cryptographic completion of a shred.

A destroyed wrapped key that lingers (here: saved before the destroy, as a free
page or a keystore snapshot would hold it) opens nothing after a rotation.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from shredder import (
    AssociatedData,
    CryptoError,
    EnvironmentConfigError,
    KekRing,
    Keystore,
    RingRef,
)

T1 = RingRef("alice", "t1")
AD = AssociatedData("alice", "owners/alice/threads/t1/turns/1", 1, "content")


def test_a_snapshot_from_before_a_shred_opens_nothing_after_rotation(tmp_path: Path) -> None:
    kek_path = tmp_path / "config" / "kek.json"
    kek = KekRing.load_or_create(kek_path, create=True)
    ks_path = tmp_path / "keystore"
    with Keystore(ks_path, kek) as ks:
        ks.create_record_keys([(T1, "k1"), (T1, "k2")])
        gone = ks.seal(T1, "k1", AD, b"forget me")
        kept = ks.seal(T1, "k2", AD, b"keep me")
    snapshot = tmp_path / "snapshot"
    shutil.copytree(ks_path, snapshot)  # what a free page or an old copy would hold
    with Keystore(ks_path, kek) as ks:
        ks.destroy(record_keys=[(T1, "k1")])
        assert ks.unrotated_since() is not None
        # Before rotation the lingering copy still opens with the live KEK.
    with Keystore(snapshot, kek) as old:
        assert old.open(T1, "k1", AD, gone) == b"forget me"
    with Keystore(ks_path, kek) as ks:
        assert ks.open(T1, "k2", AD, kept) == b"keep me"
        assert ks.cached_record_keys == 1
        renewed, rewrapped, retired = ks.rotate()
        assert (renewed, rewrapped, retired) == (1, 1, [1])
        assert ks.cached_record_keys == 0  # unwrapped under the retired generation
        assert ks.unrotated_since() is None
        assert ks.open(T1, "k2", AD, kept) == b"keep me"
    assert kek.versions == frozenset({2})
    reloaded = KekRing.load_or_create(kek_path, create=False)
    assert reloaded.versions == frozenset({2})
    with Keystore(snapshot, reloaded) as old, pytest.raises(CryptoError):
        old.open(T1, "k1", AD, gone)
    with Keystore(ks_path, reloaded) as ks:
        assert ks.open(T1, "k2", AD, kept) == b"keep me"


def test_an_in_memory_kek_refuses_rotation(tmp_path: Path) -> None:
    kek = KekRing.from_env(KekRing.generate_env_value())
    with Keystore(tmp_path / "ks", kek) as ks:
        ks.create_record_keys([(T1, "k1")])
        with pytest.raises(EnvironmentConfigError):
            ks.rotate()
        assert ks.open(T1, "k1", AD, ks.seal(T1, "k1", AD, b"x")) == b"x"


def test_a_process_whose_kek_ring_predates_a_rotation_wraps_under_the_new_version(
    tmp_path: Path,
) -> None:
    """Processes sharing a store (``lethe serve --processes N``) each hold the KEK ring.

    One rotates; another, its ring still at the retired version, must neither
    fail to open the re-wrapped keys nor wrap a new ring key under the retired
    version (which nothing could open any more: the acknowledged write's key
    lost). It found the version in the keystore and read the file again.
    """
    kek_path = tmp_path / "config" / "kek.json"
    rotating = KekRing.load_or_create(kek_path, create=True)
    stale = KekRing.load_or_create(kek_path, create=False)
    ks_path = tmp_path / "keystore"
    with Keystore(ks_path, rotating) as ks:
        ks.create_record_keys([(T1, "k1")])
        kept = ks.seal(T1, "k1", AD, b"keep me")
        assert ks.rotate()[2] == [1]
    assert stale.versions == frozenset({1})  # the other process has not looked yet
    t2 = RingRef("alice", "t2")
    ad2 = AssociatedData("alice", "owners/alice/threads/t2/turns/1", 1, "content")
    with Keystore(ks_path, stale) as ks:
        assert ks.open(T1, "k1", AD, kept) == b"keep me"  # a ring key under version 2
        ks.create_record_keys([(t2, "k1")])  # a new ring key, after the rotation
        fresh = ks.seal(t2, "k1", ad2, b"written after the rotation")
    assert stale.current_version == 2
    assert stale.versions == frozenset({2})  # the retired version left its memory too
    with Keystore(ks_path, KekRing.load_or_create(kek_path, create=False)) as ks:
        assert ks.open(t2, "k1", ad2, fresh) == b"written after the rotation"
