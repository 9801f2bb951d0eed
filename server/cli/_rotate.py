"""``lethe rotate``: complete pending shreds now, with the server stopped.

A running server holds the KEK in memory and rotates itself every
``--rotation-interval``; this command does the same rotation offline: rings
that lost a key get new ring keys, every ring key moves to a new KEK version
and the old KEK versions are destroyed.
"""

from __future__ import annotations

import argparse

from server.cli._common import EXIT_OK, Stages, Subcommands, command, emit, has_store, no_store


def add(sub: Subcommands) -> None:
    """Add ``lethe rotate`` and its flags to ``sub``."""
    command(
        sub,
        "rotate",
        "complete pending shreds now: new ring and KEK keys (server stopped)",
        json_help="{rings_renewed, ring_keys_rewrapped, kek_versions_destroyed}",
        progress=True,
    ).set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Rotate ``--data``'s store and print what was renewed and destroyed.

    Raises:
        EnvironmentConfigError: ``--data`` holds no store.
        StoreLockedError: a server is serving ``--data``.
    """
    from server.store import Store, StoreLockedError

    if not has_store(args.data):
        raise no_store(args.data)
    stages = Stages("rotate", ("open the store", "rotate rings and KEK", "close"), args.quiet)
    try:
        stages("open the store")
        try:
            store = Store(args.data, kek_file=args.kek_file)
        except StoreLockedError:
            raise StoreLockedError(
                f"{args.data} is served by a running lethe; it rotates every "
                "--rotation-interval (stop it to rotate now)"
            ) from None
        try:
            stages("rotate rings and KEK")
            renewed, rewrapped, retired = store.rotate()
        finally:
            stages("close")
            store.close()
    finally:
        stages.close()
    if args.json:
        emit(
            {
                "rings_renewed": renewed,
                "ring_keys_rewrapped": rewrapped,
                "kek_versions_destroyed": retired,
            }
        )
        return EXIT_OK
    print(
        f"rotated: {renewed} rings renewed, {rewrapped} ring keys moved to a new KEK version, "
        f"KEK versions {retired} destroyed"
    )
    return EXIT_OK
