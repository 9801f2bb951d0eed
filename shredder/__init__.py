"""Keys and ciphertext for Lethe: key hierarchy, AEAD sealing and crypto-shredding.

`shredder` knows keys and ciphertext but nothing of conversations. Callers seal, open and
destroy; they never hold a raw key. Key hierarchy, every key 32 random bytes::

    KEK ring (versioned; a file outside the data and backup paths, or an env var for tests)
     ├─ ring key     one per thread, plus one per owner (derivatives spanning threads)
     │   └─ record key   one per record version
     └─ signing key  the store's current Ed25519 key (it signs deletion receipts)

Rooms inside:

=======================  ======================================================================
module                   holds
=======================  ======================================================================
``_aead``                XChaCha20-Poly1305 sealing and key wrapping, associated data, ``RingRef``
``_kek``                 the KEK ring: versions, the KEK file, its placement
``_lmdbenv``             opening LMDB environments with durable flags
``_keystore_schema``     the keystore's named databases, key layouts, wrapped keys' associated
                         data
``_keystore_base``       ``KeystoreBase``: the state every keystore part uses; unwrapping ring
                         and record keys through their caches
``_keystore_records``    creating record keys (``FreshKeys``), moving them between rings,
                         listing them
``_keystore_sealing``    sealing and opening payloads, keyed digests, ``KeyReader``
``_keystore_shred``      destroying keys (the logical shred) and the shred log
``_keystore_rotation``   rotation (completing shreds cryptographically), KEK versions in use
``_keystore_moves``      an owner's keys moving between keystores: export, import, eviction
``_keystore_ledger``     records a data restore must never roll back (the server's tokens)
``_keystore_signing``    the store's Ed25519 signing keys (receipts): the current one wrapped
                         under the KEK, the public halves of every one
``_keystore``            opening the keystore, its store id; ``Keystore`` composes the parts
``_bundle``              sealed bundles to a receive key (rows and keys between shards)
``_backup``              data backups and restores, their manifests
``_failpoints``          named crash points for the crash tests
``errors``               the exception tree
=======================  ======================================================================

Byte layouts are documented in `shredder._aead` (ciphertext, wrapped keys, associated data),
`shredder._keystore_schema` (keystore databases), `shredder._kek` (KEK file) and
`shredder._bundle` (sealed bundles).

May import: the standard library, ``lmdb``, ``nacl`` and ``platformdirs``; never ``lethe``,
``server`` or ``index``.
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
from shredder._keystore_signing import SigningKeyInfo, signing_key_id
from shredder._lmdbenv import fsync_dir, open_durable_env
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
