"""``lethe mcp``: its flags; the MCP server itself is a client of the API (:mod:`lethe.mcp`).

Nothing here imports the ``mcp`` SDK: :mod:`lethe.mcp` is imported by
:func:`run` alone, so the rest of the command line never loads it (nor needs
the ``mcp`` extra).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from lethe.names import ID_PATTERN
from server.cli._common import EXIT_USAGE, Subcommands, address, command, owner_id

_THREAD = re.compile(f"(?:owners/{ID_PATTERN}/threads/)?{ID_PATTERN}")


def _thread(value: str) -> str:
    """Check a thread id or ``owners/{owner}/threads/{thread}`` (argparse type).

    Raises:
        argparse.ArgumentTypeError: it is neither.
    """
    if not _THREAD.fullmatch(value):
        raise argparse.ArgumentTypeError(
            "a thread id ([a-z0-9][a-z0-9-]{0,62}) or owners/{owner}/threads/{thread}"
        )
    return value


def add(sub: Subcommands) -> None:
    """Add ``lethe mcp`` and its flags to ``sub``."""
    mcp = command(
        sub,
        "mcp",
        "serve Lethe's memory as MCP tools (stdio or streamable HTTP), a client of a "
        "running server (needs the mcp extra)",
        data=False,
    )
    mcp.set_defaults(run=run)
    mcp.add_argument(
        "--target",
        type=address,
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="HOST:PORT of the Lethe server",
    )
    mcp.add_argument(
        "--token",
        default=None,
        metavar="TOKEN",
        help="bearer token the stdio session calls Lethe with (default: none; required for "
        "stdio; over HTTP each request sends its own)",
    )
    mcp.add_argument(
        "--owner",
        type=owner_id,
        default=None,
        metavar="OWNER",
        help="owner id the session acts for (default: none; required for stdio; over HTTP "
        "the X-Lethe-Owner header wins)",
    )
    mcp.add_argument(
        "--thread",
        type=_thread,
        default=None,
        metavar="THREAD",
        help="default thread: an id (created on first use) or a full thread name "
        "(default: none; tools then take a thread, or start one; over HTTP the "
        "X-Lethe-Thread header wins)",
    )
    mcp.add_argument(
        "--transport",
        choices=["stdio", "http"],
        default="stdio",
        help="stdio (a desktop agent starts the command) or http (streamable HTTP at /mcp)",
    )
    mcp.add_argument(
        "--listen",
        type=address,
        default="127.0.0.1:8765",
        metavar="HOST:PORT",
        help="HOST:PORT the http transport listens on",
    )
    https = mcp.add_argument_group("HTTPS of the http transport")
    https.add_argument(
        "--https-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM certificate chain to serve HTTPS with (default: plain HTTP; bearer tokens "
        "must not cross a network in clear text)",
    )
    https.add_argument(
        "--https-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="its PEM private key (default: plain HTTP)",
    )
    lethe = mcp.add_argument_group(
        "the connection to Lethe", "TLS unless --target is a loopback address"
    )
    lethe.add_argument(
        "--plaintext",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="force plaintext gRPC to --target",
    )
    lethe.add_argument(
        "--ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM CA bundle that signs the Lethe server's certificate (default: the system's)",
    )
    lethe.add_argument(
        "--client-cert",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM client certificate chain, for mutual TLS (default: none)",
    )
    lethe.add_argument(
        "--client-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM client private key, for mutual TLS (default: none)",
    )
    lethe.add_argument(
        "--server-name",
        default=None,
        metavar="NAME",
        help="name to check the server certificate against (default: --target's host)",
    )


def run(args: argparse.Namespace) -> int:
    """Run the MCP server (:func:`lethe.mcp.run_mcp`); returns its exit status."""
    try:
        from lethe.mcp import run_mcp
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "mcp":
            raise
        print(
            "lethe mcp: the MCP SDK is not installed: pip install 'lethe-store[mcp]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    return run_mcp(args)
