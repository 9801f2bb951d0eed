"""``lethe restore``: a data backup restored beside the live keystore.

With the server stopped: the backup's data environment replaces the live one,
then start-up recovery runs (:meth:`server.lifecycle.Lifecycle.recover`), which
forgets every record whose key was destroyed since the backup was taken, so a
restore never brings back what was forgotten; and the tokens stay as the
keystore's ledger has them (a token revoked since the backup stays revoked, one
created since stays valid), which it reports.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from server.cli._common import EXIT_OK, Stages, Subcommands, command, emit
from shredder import declare, failpoint

FP_RESTORE_AFTER_REPLACE = declare(
    "restore.after_replace",
    "lethe restore replaced the data environment; start-up recovery has not run",
)


def add(sub: Subcommands) -> None:
    """Add ``lethe restore`` and its flags to ``sub``."""
    restore = command(
        sub,
        "restore",
        "restore a data backup beside the keystore (server stopped)",
        json_help="{backup, data, forgotten, deletions_resumed, kept_without_key, tokens: "
        "{restored, revoked, removed, migrated}}",
        progress=True,
    )
    restore.set_defaults(run=run)
    restore.add_argument(
        "--backup", type=Path, required=True, help="a directory `lethe backup` wrote"
    )


def run(args: argparse.Namespace) -> int:
    """Replace ``--data``'s data environment with ``--backup``'s, then recover.

    Raises:
        EnvironmentConfigError: no keystore in ``--data``, or no ``--backup``.
        StoreLockedError: a server is serving ``--data``.
    """
    from index import load_embedder
    from server._metrics import Metrics
    from server.lifecycle import Lifecycle
    from server.retrieval import Retriever
    from server.store import Store, acquire_lock, data_paths
    from shredder import RESTORE_STAGES, EnvironmentConfigError, Keystore, restore_environment

    data_env, ks_path = data_paths(args.data.resolve())
    store_id = Keystore.read_store_id(ks_path)
    if store_id is None:
        raise EnvironmentConfigError(f"{args.data} has no keystore to restore beside")
    if not args.backup.is_dir():
        raise EnvironmentConfigError(f"backup directory {args.backup} does not exist")
    stages = Stages("restore", (*RESTORE_STAGES, "recover"), args.quiet)
    try:
        fd = acquire_lock(args.data.resolve())
        try:
            restore_environment(args.backup, data_env, store_id, progress=stages)
        finally:
            os.close(fd)
        stages("recover")
        store = Store(args.data, kek_file=args.kek_file)
        try:
            lifecycle = Lifecycle(store, Retriever(store, load_embedder("none")), Metrics())
            failpoint(FP_RESTORE_AFTER_REPLACE)
            recovery = lifecycle.recover()
        finally:
            store.close()
    finally:
        stages.close()
    kept = len(recovery.kept_without_key)
    tokens = recovery.tokens
    if args.json:
        emit(
            {
                "backup": str(args.backup.resolve()),
                "data": str(args.data.resolve()),
                "forgotten": recovery.forgotten,
                "deletions_resumed": recovery.deletions_resumed,
                "kept_without_key": kept,
                "tokens": None
                if tokens is None
                else {
                    "restored": tokens.restored,
                    "revoked": tokens.revoked,
                    "removed": tokens.removed,
                    "migrated": tokens.migrated,
                },
            }
        )
        return EXIT_OK
    print(
        f"restored {args.backup} into {args.data}: {recovery.forgotten} turns and memories "
        f"whose keys were destroyed since the backup are forgotten; "
        f"{recovery.deletions_resumed} deletions resumed"
        + (f"; {kept} records without a key kept (see the log, lethe audit)" if kept else "")
        + (
            "; tokens as the keystore's ledger has them: "
            f"{len(tokens.revoked)} revoked since the backup revoked again, "
            f"{len(tokens.restored)} created since the backup kept"
            if tokens is not None
            else "; tokens not reconciled (see the log)"
        )
    )
    return EXIT_OK
