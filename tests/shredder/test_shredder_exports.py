"""Pins the public names of `shredder`."""

from __future__ import annotations

import shredder


def test_public_names_are_pinned() -> None:
    assert sorted(shredder.__all__) == [
        "AssociatedData",
        "BACKUP_STAGES",
        "BackupManifest",
        "CryptoError",
        "EnvironmentConfigError",
        "FAILPOINTS_ENV",
        "FreshKeys",
        "IntegrityError",
        "KekRing",
        "KeyExistsError",
        "KeyNotFoundError",
        "KeyReader",
        "Keystore",
        "POINTS",
        "RESTORE_STAGES",
        "ReceiveKey",
        "RingRef",
        "ShredderError",
        "SigningKeyInfo",
        "backup_environment",
        "check_kek_placement",
        "declare",
        "default_kek_path",
        "failpoint",
        "fsync_dir",
        "open_bundle",
        "open_durable_env",
        "read_manifest",
        "restore_environment",
        "seal_bundle",
        "signing_key_id",
    ]


def test_public_names_resolve_and_come_from_the_package() -> None:
    for name in shredder.__all__:
        obj = getattr(shredder, name)
        if name.isupper():  # constants: the failpoint variable's name and registry
            continue
        assert obj.__module__.startswith("shredder"), name


def test_exception_tree() -> None:
    assert issubclass(shredder.CryptoError, shredder.ShredderError)
    assert issubclass(shredder.KeyNotFoundError, shredder.CryptoError)
    assert issubclass(shredder.IntegrityError, shredder.CryptoError)
    assert issubclass(shredder.EnvironmentConfigError, shredder.ShredderError)
    assert not issubclass(shredder.EnvironmentConfigError, shredder.CryptoError)
    assert issubclass(shredder.KeyExistsError, shredder.ShredderError)
    assert issubclass(shredder.KeyExistsError, ValueError)
