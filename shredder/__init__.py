"""Keys and ciphertext for Lethe: key hierarchy, AEAD sealing and crypto-shredding.

`shredder` knows keys and ciphertext but nothing of conversations. Callers seal, open and
destroy; they never hold a raw key. Key hierarchy, every key 32 random bytes::

    KEK ring (versioned; a file outside the data and backup paths, or an env var for tests)
     └─ ring key     one per thread, plus one per owner (derivatives spanning threads)
         └─ record key   one per record version

Byte layouts are documented in `shredder._aead` (ciphertext, wrapped keys, associated data),
`shredder._keystore_schema` (keystore databases) and `shredder._kek` (KEK file).
"""

from shredder._aead import AssociatedData, RingRef
from shredder._backup import (
    BACKUP_STAGES,
    RESTORE_STAGES,
    BackupManifest,
    backup_environment,
    read_manifest,
    restore_environment,
)
from shredder._bundle import ReceiveKey, open_bundle, seal_bundle
from shredder._failpoints import FAILPOINTS_ENV, POINTS, declare, failpoint
from shredder._kek import KekRing, check_kek_placement, default_kek_path
from shredder._keystore import Keystore
from shredder._keystore_records import FreshKeys
from shredder._keystore_sealing import KeyReader
from shredder._lmdbenv import open_durable_env
from shredder.errors import (
    CryptoError,
    EnvironmentConfigError,
    IntegrityError,
    KeyExistsError,
    KeyNotFoundError,
    ShredderError,
)

__all__ = [
    "BACKUP_STAGES",
    "FAILPOINTS_ENV",
    "POINTS",
    "RESTORE_STAGES",
    "AssociatedData",
    "BackupManifest",
    "CryptoError",
    "EnvironmentConfigError",
    "FreshKeys",
    "IntegrityError",
    "KekRing",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeyReader",
    "Keystore",
    "ReceiveKey",
    "RingRef",
    "ShredderError",
    "backup_environment",
    "check_kek_placement",
    "declare",
    "default_kek_path",
    "failpoint",
    "open_bundle",
    "open_durable_env",
    "read_manifest",
    "restore_environment",
    "seal_bundle",
]
