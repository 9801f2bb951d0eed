"""``lethe token create | list | revoke``: bearer tokens of a data directory.

It works on the data directory of a running server (tokens are read on every
call): a new token works at once, a revoked or expired one is refused within
a second, open streams included. The token prints on stdout alone (for
``T=$(lethe token create ...)``), everything else about it on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from lethe._units import parse_duration
from server.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    HelpFormatter,
    Subcommands,
    command,
    emit,
    open_beside,
    owner_id,
    rfc3339,
    when,
)


def label(value: str) -> str:
    """Check a token label against :data:`server.edge.LABEL_RE` (argparse type).

    Raises:
        argparse.ArgumentTypeError: it does not match.
    """
    from server.edge import LABEL_RE

    if not LABEL_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            "labels match [A-Za-z0-9][A-Za-z0-9._-]{0,63} (stored in plaintext: no content)"
        )
    return value


def add(sub: Subcommands) -> None:
    """Add ``lethe token create | list | revoke`` and their flags to ``sub``."""
    token = sub.add_parser(
        "token",
        help="create, list and revoke bearer tokens",
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    token.set_defaults(run=run)
    token_sub = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = command(
        token_sub,
        "create",
        "print a new bearer token",
        json_help="{token, id, owners, admin, label, expire_time}",
    )
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--owner",
        type=owner_id,
        action="append",
        dest="owners",
        help="an owner id it may act for (repeat for more; command line only)",
    )
    who.add_argument(
        "--admin", action="store_true", help="acts for every owner (command line only)"
    )
    create.add_argument(
        "--label",
        type=label,
        default=None,
        help="a name for it, stored in plaintext: no content (default: none)",
    )
    create.add_argument(
        "--expires-in",
        type=parse_duration,
        default=None,
        help="refuse it after this, e.g. 30d (default: never expires)",
    )
    command(
        token_sub,
        "list",
        "list tokens (ids, never secrets)",
        json_help="{tokens: [{id, state, create_time, expire_time, label, admin, owners}]}",
    )
    revoke = command(
        token_sub,
        "revoke",
        "revoke a token by id (takes effect within 1 s)",
        json_help="{id, revoke_time}",
    )
    revoke.add_argument("id", help="the token's id, as `lethe token list` shows it")


def _state(row: Any, now: float) -> str:
    return "revoked" if row.revoke_time else "active" if row.active(now) else "expired"


def run(args: argparse.Namespace) -> int:
    """Run ``lethe token ACTION``.

    Returns:
        :data:`EXIT_OK`, or :data:`EXIT_FAILED` when ``revoke`` finds no such id.

    Raises:
        EnvironmentConfigError: ``--data`` holds no store.
    """
    store = open_beside(args)
    try:
        if args.action == "create":
            return _create(store, args)
        if args.action == "list":
            return _list(store, args)
        return _revoke(store, args)
    finally:
        store.close()


def _create(store: Any, args: argparse.Namespace) -> int:
    from server.edge import new_token, token_digest

    token = new_token()
    expire = time.time() + args.expires_in if args.expires_in else 0.0
    row = store.create_token(
        token_digest(token),
        args.owners or [],
        args.admin,
        label=args.label or "",
        expire_time=expire,
    )
    if args.json:
        emit(
            {
                "token": token,
                "id": row.id,
                "owners": list(row.owners),
                "admin": row.admin,
                "label": row.label or None,
                "expire_time": rfc3339(row.expire_time),
            }
        )
    else:
        print(token)
    print(f"lethe: token {row.id} created; expires {when(expire)}", file=sys.stderr)
    return EXIT_OK


def _list(store: Any, args: argparse.Namespace) -> int:
    now = time.time()
    rows = store.tokens()
    if args.json:
        emit(
            {
                "tokens": [
                    {
                        "id": row.id,
                        "state": _state(row, now),
                        "create_time": rfc3339(row.create_time),
                        "expire_time": rfc3339(row.expire_time),
                        "revoke_time": rfc3339(row.revoke_time),
                        "label": row.label or None,
                        "admin": row.admin,
                        "owners": list(row.owners),
                    }
                    for row in rows
                ]
            }
        )
        return EXIT_OK
    print(f"{'id':<16}  {'state':<8}  {'created':<20}  {'expires':<20}  label  acts for")
    for row in rows:
        who = "admin" if row.admin else ",".join(row.owners)
        print(
            f"{row.id:<16}  {_state(row, now):<8}  {when(row.create_time):<20}  "
            f"{when(row.expire_time):<20}  {row.label or '-'}  {who}"
        )
    return EXIT_OK


def _revoke(store: Any, args: argparse.Namespace) -> int:
    revoked = store.revoke_token(args.id)
    if revoked is None:
        print(f"lethe: no token has id {args.id!r} (see `lethe token list`)", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        emit({"id": revoked.id, "revoke_time": rfc3339(revoked.revoke_time)})
    else:
        print(f"revoked {revoked.id} at {when(revoked.revoke_time)}")
    return EXIT_OK
