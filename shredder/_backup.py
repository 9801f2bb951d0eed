"""Data backups that cannot overrule a deletion.

A backup is ``copy(compact=True)`` of the data environment — a consistent
snapshot taken inside one read transaction, safe while a server writes — plus
a manifest. It never contains the keystore or the KEK: every payload in it is
ciphertext whose record key lives only in the live keystore, so a key
destroyed after the backup makes that content unrecoverable from the backup
(crypto-shredding, ARCHITECTURE.md "Keys and crypto-shredding").

Backup directory layout::

    OUT/data.mdb        compacted copy of the data environment
    OUT/MANIFEST.json   {"format": "lethe-backup/1", "store_id", "created_time" (s),
                         "bytes", "sha256" (of data.mdb)}
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lmdb

from shredder._failpoints import declare, failpoint
from shredder._lmdbenv import fsync_dir, open_durable_env
from shredder.errors import EnvironmentConfigError

BACKUP_FORMAT = "lethe-backup/1"
MANIFEST = "MANIFEST.json"
BACKUP_STAGES = ("copy", "sync", "sha256", "manifest")
"""The stages :func:`backup_environment` reports to its ``progress``, in order."""
RESTORE_STAGES = ("verify", "copy", "replace")
"""The stages :func:`restore_environment` reports to its ``progress``, in order."""


def _no_progress(stage: str) -> None:
    del stage


@dataclass(frozen=True)
class BackupManifest:
    """What a backup holds, as its manifest records it.

    Its store id, creation time (seconds since the epoch), and the size in bytes
    and SHA-256 (hex) of ``data.mdb``.
    """

    store_id: str
    created_time: float
    bytes: int
    sha256: str


FP_BACKUP_AFTER_COPY = declare(
    "backup.after_copy",
    "the backup's data.mdb is written; its manifest is not (a restore must refuse it)",
)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def backup_environment(
    env_path: Path,
    out_dir: Path,
    store_id: str,
    *,
    env: lmdb.Environment | None = None,
    progress: Callable[[str], None] = _no_progress,
) -> BackupManifest:
    """Write a compacted, consistent copy of the LMDB environment at ``env_path``.

    Args:
        env_path: the data environment directory.
        out_dir: a new or empty directory.
        store_id: the keystore's id, recorded so a restore can refuse a backup
            of another store.
        env: the environment, when this process already has it open (LMDB
            allows one open handle per environment and process).
        progress: called with each of :data:`BACKUP_STAGES` as it starts.

    Raises:
        EnvironmentConfigError: ``out_dir`` is not empty or lies inside ``env_path``.
    """
    out_dir = out_dir.resolve()
    if out_dir.is_relative_to(env_path.resolve()):
        raise EnvironmentConfigError("the backup directory must not be inside the data environment")
    if out_dir.exists() and any(out_dir.iterdir()):
        raise EnvironmentConfigError(f"{out_dir} is not empty")
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    progress("copy")
    if env is not None:
        env.copy(str(out_dir), compact=True)
    else:
        own = open_durable_env(env_path, map_size=64 << 30, max_dbs=32, readonly=True)
        try:
            own.copy(str(out_dir), compact=True)
        finally:
            own.close()
    data = out_dir / "data.mdb"
    os.chmod(data, 0o600)
    progress("sync")
    with data.open("rb+") as f:
        os.fsync(f.fileno())
    failpoint(FP_BACKUP_AFTER_COPY)
    progress("sha256")
    manifest = BackupManifest(store_id, time.time(), data.stat().st_size, _digest(data))
    progress("manifest")
    body = {"format": BACKUP_FORMAT, **manifest.__dict__}
    manifest_path = out_dir / MANIFEST
    manifest_path.write_text(json.dumps(body, indent=2) + "\n")
    os.chmod(manifest_path, 0o600)
    fsync_dir(out_dir)
    return manifest


def read_manifest(backup_dir: Path) -> BackupManifest:
    """Read and verify a backup's manifest against its ``data.mdb``.

    Raises:
        EnvironmentConfigError: missing or malformed manifest, or a digest mismatch.
    """
    try:
        body = json.loads((backup_dir / MANIFEST).read_text())
        if body.pop("format") != BACKUP_FORMAT:
            raise ValueError("format")
        manifest = BackupManifest(**body)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise EnvironmentConfigError(f"{backup_dir} is not a lethe backup: {exc}") from None
    if _digest(backup_dir / "data.mdb") != manifest.sha256:
        raise EnvironmentConfigError(f"{backup_dir}/data.mdb does not match its manifest")
    return manifest


def restore_environment(
    backup_dir: Path,
    env_path: Path,
    store_id: str,
    *,
    progress: Callable[[str], None] = _no_progress,
) -> BackupManifest:
    """Replace the data environment at ``env_path`` with a backup's copy.

    The keystore is not touched: records whose keys were destroyed after the
    backup come back as unreadable ciphertext, which the server forgets when
    it next opens the store.

    Args:
        backup_dir: the backup's directory (``data.mdb`` and ``MANIFEST.json``).
        env_path: the data environment's directory; created (mode 0700) if missing.
        store_id: the live keystore's id; the backup must carry the same.
        progress: called with each of :data:`RESTORE_STAGES` as it starts.

    Returns:
        The backup's manifest.

    Raises:
        EnvironmentConfigError: bad backup, or a backup of another store.
    """
    progress("verify")
    manifest = read_manifest(backup_dir)
    if manifest.store_id != store_id:
        raise EnvironmentConfigError(
            "this backup belongs to another keystore; restore it beside its own keystore"
        )
    env_path.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = env_path / "data.mdb.restoring"
    progress("copy")
    shutil.copyfile(backup_dir / "data.mdb", tmp)
    os.chmod(tmp, 0o600)
    with tmp.open("rb+") as f:
        os.fsync(f.fileno())
    progress("replace")
    os.replace(tmp, env_path / "data.mdb")
    lock = env_path / "lock.mdb"
    if lock.exists():
        lock.unlink()
    fsync_dir(env_path)
    return manifest
