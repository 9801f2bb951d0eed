"""``lethe backup``: a consistent, compacted copy of the data environment.

Safe while a server serves the directory. The copy holds ciphertext and
non-content metadata only; the keystore and the KEK are never included, so a
backup cannot overrule a deletion (docs/operating.md, "Backups and rotation").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from server.cli._common import EXIT_OK, Stages, Subcommands, command, emit, no_store, rfc3339


def add(sub: Subcommands) -> None:
    """Add ``lethe backup`` and its flags to ``sub``."""
    backup = command(
        sub,
        "backup",
        "consistent compacted copy of the data environment (safe while serving)",
        json_help="{out, bytes, sha256, store_id, create_time}",
        progress=True,
    )
    backup.set_defaults(run=run)
    backup.add_argument(
        "--out", type=Path, required=True, help="a new or empty directory outside --data"
    )


def kek_path(data: Path, kek_file: Path | None) -> Path | None:
    """The KEK file of ``data``'s store: ``kek_file`` if given, else its store id's default path.

    None when ``data`` holds no store.
    """
    from server.store import data_paths
    from shredder import Keystore, default_kek_path

    store_id = Keystore.read_store_id(data_paths(data.resolve())[1])
    if kek_file is not None:
        return kek_file
    return default_kek_path(store_id) if store_id else None


def run(args: argparse.Namespace) -> int:
    """Write the backup to ``--out`` and print what was written.

    Raises:
        EnvironmentConfigError: no store in ``--data``, or ``--out`` inside it or
            beside the KEK.
    """
    from server.store import data_paths, open_store_for
    from shredder import (
        BACKUP_STAGES,
        EnvironmentConfigError,
        Keystore,
        backup_environment,
        check_kek_placement,
    )

    data_env, ks_path = data_paths(args.data.resolve())
    store_id = Keystore.read_store_id(ks_path)
    if store_id is None or not (data_env / "data.mdb").exists():
        raise no_store(args.data)
    kek = kek_path(args.data, args.kek_file)
    if kek is not None:
        check_kek_placement(kek, [args.out])
    if args.out.resolve().is_relative_to(args.data.resolve()):
        raise EnvironmentConfigError(
            f"the backup directory {args.out} must be outside the data directory {args.data}"
        )
    stages = Stages("backup", BACKUP_STAGES, args.quiet)
    try:
        live = open_store_for(args.data)
        manifest = backup_environment(
            data_env,
            args.out,
            store_id,
            env=live.env if live is not None else None,
            progress=stages,
        )
    finally:
        stages.close()
    if args.json:
        emit(
            {
                "out": str(args.out.resolve()),
                "bytes": manifest.bytes,
                "sha256": manifest.sha256,
                "store_id": manifest.store_id,
                "create_time": rfc3339(manifest.created_time),
            }
        )
        return EXIT_OK
    print(
        f"backup of {args.data} written to {args.out} ({manifest.bytes} bytes, "
        f"sha256 {manifest.sha256[:16]}…); keystore and KEK not included"
    )
    return EXIT_OK
