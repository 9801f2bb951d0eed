"""``lethe export``: an owner's records from a running server, into a JSON Lines file.

A client of the API (``Lifecycle.ExportOwner`` through :mod:`lethe.remote`):
every live record the token may read — threads, turns with state and times,
memories at every version, lineage edges, signed deletion receipts — and
sealed repair material only with ``--include-sealed``. The file holds the
owner's content in plaintext (mode 0600) and appears only once complete;
THREAT_MODEL.md, "Export files", says how to handle it. A progress line
counts the items on a terminal.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from server.cli._common import (
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    add_remote,
    command,
    emit,
    owner_id,
    run_remote,
)


def add(sub: Subcommands) -> None:
    """Add ``lethe export`` and its flags to ``sub``."""
    parser = command(
        sub,
        "export",
        "write everything of an owner a running server holds (records, every memory version, "
        "lineage, signed receipts) to a JSON Lines file",
        data=False,
        json_help="{out, owner, store_id, bytes, threads, turns, memory_versions, edges, receipts}",
        progress=True,
    )
    add_remote(parser)
    parser.add_argument("--owner", type=owner_id, required=True, help="the owner to export")
    parser.add_argument(
        "--out",
        type=Path,
        required=True,
        metavar="FILE",
        help="the file to write (JSON Lines, mode 0600: it holds the owner's content)",
    )
    parser.add_argument(
        "--include-sealed",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also sealed repair material (repair threads, their sealed turns and memories)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Export ``--owner`` to ``--out`` and print what it holds.

    Returns:
        :data:`EXIT_OK`; :data:`EXIT_USAGE` when the server cannot be reached or
        refuses, or the stream ends early (no file is left).
    """
    from tqdm import tqdm

    from lethe.remote import IncompleteExport, export_owner

    def work(client: Any) -> int:
        bar = tqdm(
            desc=f"export owners/{args.owner}",
            unit="item",
            file=sys.stderr,
            disable=True if args.quiet else None,
            leave=False,
        )
        try:
            doc = export_owner(
                client,
                args.owner,
                args.out,
                include_sealed=args.include_sealed,
                on_item=lambda _: bar.update(1),
            )
        except IncompleteExport as exc:
            print(f"lethe export: {exc}; no file written", file=sys.stderr)
            return EXIT_USAGE
        finally:
            bar.close()
        if args.json:
            emit(doc)
        else:
            print(
                f"wrote {doc['out']} ({doc['bytes']} bytes): {doc['threads']} threads, "
                f"{doc['turns']} turns, {doc['memory_versions']} memory versions, "
                f"{doc['edges']} lineage edges, {doc['receipts']} receipts"
            )
        return EXIT_OK

    return run_remote(args, work)
