"""``lethe audit``: the audit counts of every owner, from outside the server or through it.

On ``--data``: safe beside a running server (it only reads). Index drift is not
measured: only ``Lifecycle.Audit`` on the server, which holds the indexes, can
count it. Besides the owners' counts it counts the stray temporary KEK files a
crash left beside the KEK file (``stray_key_files``; they may hold destroyed KEK
versions).

With ``--target`` (and a token) it asks a running server instead
(``Lifecycle.Audit``, through :mod:`lethe.remote`) for each ``--owner``: every
count, index drift included, from the machine of a data-protection officer.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from server.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Subcommands,
    add_remote,
    command,
    emit,
    has_store,
    no_store,
    owner_id,
    run_remote,
)

OFFLINE_UNMEASURED = ("index_drift",)
"""Audit counts ``lethe audit`` cannot measure: the indexes live in the serving
process (``Lifecycle.Audit`` counts index drift there)."""


def add(sub: Subcommands) -> None:
    """Add ``lethe audit`` and its flags to ``sub``."""
    parser = command(
        sub,
        "audit",
        "print the audit counts of every owner (or of each --owner on a running server "
        "with --target); exit 1 if any count is non-zero",
        json_help="{healthy, totals, owners: {owner: counts}, stray_key_files} "
        "(unhealthy owners only; with --target: {healthy, totals, owners, target})",
    )
    add_remote(parser, required=False)
    parser.add_argument(
        "--owner",
        type=owner_id,
        action="append",
        dest="owners",
        default=None,
        help="with --target: an owner to audit (repeat for more; command line only)",
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Audit every owner of ``--data`` and print the unhealthy ones and the totals.

    Returns:
        :data:`EXIT_OK` when every count is zero, else :data:`EXIT_FAILED`.

    Raises:
        EnvironmentConfigError: ``--data`` holds no store.
    """
    if args.target:
        return _remote(args)
    from server.store import AuditCounts, Store

    if not has_store(args.data):
        raise no_store(args.data)
    store = Store(args.data, kek_file=args.kek_file, lock=False)

    def measured(counts: Any) -> dict[str, int]:
        return {k: v for k, v in asdict(counts).items() if k not in OFFLINE_UNMEASURED}

    total = AuditCounts()
    unhealthy: dict[str, dict[str, int]] = {}
    try:
        strays = store.stray_key_files()
        for owner in store.owners():
            counts = store.audit(owner)
            for key, value in asdict(counts).items():
                setattr(total, key, getattr(total, key) + value)
            if not counts.healthy():
                unhealthy[owner] = measured(counts)
    finally:
        store.close()
    healthy = total.healthy() and not strays
    if args.json:
        emit(
            {
                "healthy": healthy,
                "totals": measured(total),
                "owners": unhealthy,
                "stray_key_files": strays,
                "not_measured": list(OFFLINE_UNMEASURED),
            }
        )
    else:
        for owner, counts_of in unhealthy.items():
            print(f"owners/{owner}: {counts_of}")
        for key, value in measured(total).items():
            print(f"{key}: {value}")
        print(f"stray_key_files: {strays}")
    return EXIT_OK if healthy else EXIT_FAILED


def _remote(args: argparse.Namespace) -> int:
    """``lethe audit --target``: ``Lifecycle.Audit`` of each ``--owner`` on the server."""
    import sys

    from lethe.remote import audit

    if not args.owners:
        print("lethe audit: --target needs at least one --owner", file=sys.stderr)
        return EXIT_USAGE

    def work(client: Any) -> int:
        doc = audit(client, args.owners)
        if args.json:
            emit({**doc, "target": args.target})
        else:
            for owner, counts_of in doc["owners"].items():
                print(f"owners/{owner}: {counts_of}")
            for key, value in doc["totals"].items():
                print(f"{key}: {value}")
        return EXIT_OK if doc["healthy"] else EXIT_FAILED

    return run_remote(args, work)
