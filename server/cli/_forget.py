"""``lethe forget``: erase records on a running server and print the signed receipt.

A client of the API (``Lifecycle.Forget`` through :mod:`lethe.remote`): the
names may be turns, turn ranges, memories, threads or a whole owner
(``owners/{o}``), all of one owner. It returns when the deletion is effective
for every reader; the receipt (signed by the store, content-free) goes to
stdout, and with ``--out`` to a file that ``lethe receipt verify`` checks.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from server.cli._common import EXIT_OK, Subcommands, add_remote, command, emit, run_remote

_RANGE = re.compile(r"(?P<thread>owners/[^/]+/threads/[^/:]+):(?P<first>\d+)-(?P<last>\d+)")


def turn_range(value: str) -> tuple[str, int, int]:
    """Parse ``owners/{o}/threads/{t}:FROM-TO`` (argparse type).

    Raises:
        argparse.ArgumentTypeError: another shape, or FROM above TO.
    """
    match = _RANGE.fullmatch(value)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected owners/OWNER/threads/THREAD:FROM-TO (turn seqs), got {value!r}"
        )
    first, last = int(match["first"]), int(match["last"])
    if not 1 <= first <= last:
        raise argparse.ArgumentTypeError("a range needs 1 <= FROM <= TO")
    return match["thread"], first, last


def add(sub: Subcommands) -> None:
    """Add ``lethe forget`` and its flags to ``sub``."""
    parser = command(
        sub,
        "forget",
        "forget records on a running server (every descendant, their keys) and print the "
        "signed receipt; exit 1 if a named record is not found (nothing is deleted)",
        data=False,
        json_help="{receipt} (the signed DeletionReceipt, proto field names)",
    )
    add_remote(parser)
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help="turn, memory, thread or owner names (owners/alice forgets the whole owner), "
        "all of one owner",
    )
    parser.add_argument(
        "--range",
        type=turn_range,
        default=None,
        metavar="THREAD:FROM-TO",
        help="also forget turns FROM..TO of a thread (default: none)",
    )
    parser.add_argument(
        "--delete-responses",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="delete assistant turns built on what is forgotten instead of marking them tainted",
    )
    parser.add_argument(
        "--reason",
        default="",
        help="kept on the receipt in plaintext, at most 256 bytes: no content (default: FORGET)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the receipt to FILE as JSON, for `lethe receipt verify` (default: none)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Forget, print the receipt (and write it to ``--out``).

    Returns:
        :data:`EXIT_OK`; :data:`server.cli._common.EXIT_FAILED` when a named record
        is not found; :data:`server.cli._common.EXIT_USAGE` when the server cannot
        be reached or refuses the token, the owner or the names.
    """
    from lethe.remote import forget, receipt_document

    def work(client: Any) -> int:
        receipt = forget(
            client,
            args.names,
            turn_range=args.range,
            delete_responses=args.delete_responses,
            reason=args.reason,
        )
        doc = receipt_document(receipt)
        if args.out is not None:
            args.out.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        if args.json:
            emit(doc)
            return EXIT_OK
        done = [d.name for d in receipt.destinations if d.done]
        print(f"{receipt.name}: {receipt.deleted} records deleted ({receipt.cascaded} cascaded)")
        print(f"destinations done: {', '.join(done)}")
        horizon = receipt.shred_horizon_time
        print(
            "shred horizon: "
            + (horizon.ToJsonString() if receipt.HasField("shred_horizon_time") else "none")
        )
        print(f"signed by store {receipt.store_id}, key {receipt.signing_key_id}")
        return EXIT_OK

    return run_remote(args, work)
