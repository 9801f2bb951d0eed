"""``lethe retention``: how long records, threads or an owner's new records live, on a server.

A client of the API (``Lifecycle.SetRetention`` through :mod:`lethe.remote`):
turn, memory and thread names get an expiry (``--ttl`` from now, or
``--expire-time``); ``owners/{o}`` gets a default that every turn and memory
created from then on carries from its creation. From the expiry on every read
treats them as forgotten, and the server's sweeper forgets them with a receipt
(reason ``RETENTION``). ``--clear`` removes a retention.
"""

from __future__ import annotations

import argparse
import datetime as dt
from typing import Any

from lethe._units import parse_duration
from server.cli._common import EXIT_OK, Subcommands, add_remote, command, emit, run_remote


def rfc3339_time(text: str) -> float:
    """Parse ``2027-01-31T00:00:00Z`` (a zone is required) into seconds since the epoch.

    Raises:
        argparse.ArgumentTypeError: not an RFC 3339 time with a zone.
    """
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an RFC 3339 time, got {text!r}") from None
    if when.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone (add Z for UTC)")
    return when.timestamp()


def _span(seconds: float) -> str:
    """``365d``, ``12h``, ``90m`` or ``30s``: the largest unit that divides ``seconds``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def add(sub: Subcommands) -> None:
    """Add ``lethe retention`` and its flags to ``sub``."""
    parser = command(
        sub,
        "retention",
        "set how long records, threads or an owner's new records live on a running server",
        data=False,
        json_help="{records, expire_time, owner_default_seconds}",
    )
    add_remote(parser)
    parser.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        help="turn, memory or thread names of one owner, or owners/OWNER alone (its default "
        "for the records created from now on)",
    )
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--ttl",
        type=parse_duration,
        default=None,
        help="how long from now, e.g. 30d (for an owner: from each new record's creation); "
        "one of --ttl, --expire-time, --clear (required)",
    )
    how.add_argument(
        "--expire-time",
        type=rfc3339_time,
        default=None,
        metavar="TIME",
        help="when, RFC 3339 with a zone (2027-01-31T00:00:00Z); not for an owner; "
        "one of --ttl, --expire-time, --clear (required)",
    )
    how.add_argument(
        "--clear",
        action="store_true",
        default=False,
        help="remove the retention (of an owner: its default); one of --ttl, --expire-time, "
        "--clear (required)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Set the retention and print what changed.

    Returns:
        :data:`EXIT_OK`; :data:`server.cli._common.EXIT_FAILED` when a named record
        is not found (nothing is changed); :data:`server.cli._common.EXIT_USAGE`
        when the server cannot be reached or refuses.
    """
    from lethe.remote import set_retention

    def work(client: Any) -> int:
        doc = set_retention(
            client, args.names, ttl=args.ttl, expire_time=args.expire_time, clear=args.clear
        )
        if args.json:
            emit(doc)
        elif doc["owner_default_seconds"] is not None:
            print(f"{args.names[0]}: new records live {_span(doc['owner_default_seconds'])}")
        elif args.names[0].count("/") == 1:
            print(f"{args.names[0]}: no default retention")
        else:
            until = doc["expire_time"] or "never (retention removed)"
            print(f"{len(doc['records'])} records expire {until}")
        return EXIT_OK

    return run_remote(args, work)
