"""``lethe mcp`` from its parsed flags (``server/cli/_mcp.py`` defines them).

Over stdio the session acts with ``--token`` for ``--owner`` (and
``--thread`` as its default thread); over HTTP each request brings its own
token (:mod:`lethe.mcp._http`). The connection to the Lethe server is the
typed client's: TLS unless the target is a loopback address, ``--ca`` (and
``--client-cert`` / ``--client-key`` for mutual TLS, ``--server-name``) for a
private CA, ``--plaintext`` to force plaintext.

Exit status: 0 when stdin closes (stdio) or after SIGINT / SIGTERM (HTTP); 2
with one line on stderr for a flag that is missing or a file that cannot be
read or an address that cannot be bound (the ``lethe`` command line's usage
status).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path

from lethe.client import AsyncClient, TLSConfig
from lethe.mcp._http import Principals, serve_http
from lethe.mcp._server import build_server, serve_stdio
from lethe.mcp._tools import Session

__all__ = ["run_mcp", "tls_config"]

_EXIT_OK = 0
"""Success (``server.cli.EXIT_OK``; ``lethe`` may not import ``server``)."""
_EXIT_USAGE = 2
"""Usage or resource error, one line on stderr (``server.cli.EXIT_USAGE``)."""


def tls_config(args: argparse.Namespace) -> TLSConfig | bool | None:
    """The ``tls`` argument of the Lethe client from the flags.

    Args:
        args: with ``plaintext``, ``ca``, ``client_cert``, ``client_key`` and
            ``server_name``.

    Returns:
        False with ``--plaintext``; a :class:`lethe.client.TLSConfig` when a
        CA, client certificate or server name is given; None otherwise (TLS
        unless the target is a loopback address).

    Raises:
        OSError: a certificate or key file cannot be read.
        ValueError: ``--plaintext`` together with a TLS flag, or only one of
            ``--client-cert`` and ``--client-key``.
    """
    given = [args.ca, args.client_cert, args.client_key, args.server_name]
    if args.plaintext:
        if any(v is not None for v in given):
            raise ValueError("--plaintext goes with none of --ca, --client-cert, --client-key")
        return False
    if (args.client_cert is None) != (args.client_key is None):
        raise ValueError("--client-cert and --client-key go together")
    if all(v is None for v in given):
        return None

    def read(path: Path | None) -> bytes | None:
        return None if path is None else Path(path).read_bytes()

    return TLSConfig(
        root_certificates=read(args.ca),
        private_key=read(args.client_key),
        certificate_chain=read(args.client_cert),
        server_name=args.server_name,
    )


async def _stdio(args: argparse.Namespace, tls: TLSConfig | bool | None) -> None:
    client = AsyncClient(args.target, args.token, tls=tls)
    session = Session(client, args.owner, args.thread or "")

    async def session_for(ctx: object) -> Session:
        return session

    print(
        f"lethe mcp: MCP over stdio for owners/{args.owner}, Lethe at {args.target}",
        file=sys.stderr,
        flush=True,
    )
    try:
        await serve_stdio(build_server(session_for))
    finally:
        await client.close()


async def _http(args: argparse.Namespace, tls: TLSConfig | bool | None) -> None:
    host, _, port = args.listen.rpartition(":")
    principals = Principals(args.target, tls=tls, owner=args.owner or "", thread=args.thread or "")

    def ready(url: str) -> None:
        print(f"lethe mcp serving {url} (streamable HTTP; Lethe at {args.target})", flush=True)

    await serve_http(
        build_server(principals.session_for),
        principals,
        host=host,
        port=int(port),
        certfile=str(args.https_cert) if args.https_cert else None,
        keyfile=str(args.https_key) if args.https_key else None,
        ready=ready,
    )


def _usage(message: str) -> int:
    print(f"lethe mcp: {message}", file=sys.stderr)
    return _EXIT_USAGE


def run_mcp(args: argparse.Namespace) -> int:
    """Run ``lethe mcp`` until stdin closes (stdio) or it is stopped (HTTP).

    Args:
        args: the parsed flags of ``lethe mcp`` (``target``, ``token``,
            ``owner``, ``thread``, ``transport``, ``listen``, ``https_cert``,
            ``https_key`` and the TLS flags of :func:`tls_config`).

    Returns:
        0, or 2 after one line on stderr for a missing flag, an unreadable
        file or an address that cannot be bound.
    """
    for name in ("mcp", "httpx", "httpx2", "uvicorn", "sse_starlette"):
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        tls = tls_config(args)
    except ValueError as exc:
        return _usage(str(exc))
    except OSError as exc:
        return _usage(f"cannot read {exc.filename}: {exc.strerror or exc}")
    if (args.https_cert is None) != (args.https_key is None):
        return _usage("--https-cert and --https-key go together")
    if args.transport == "stdio":
        if not args.token:
            return _usage("--token (or LETHE_TOKEN) is required with --transport stdio")
        if not args.owner:
            return _usage("--owner (or LETHE_OWNER) is required with --transport stdio")
        asyncio.run(_stdio(args, tls))
        return _EXIT_OK
    try:
        asyncio.run(_http(args, tls))
    except OSError as exc:
        return _usage(f"cannot serve on {args.listen}: {exc.strerror or exc}")
    return _EXIT_OK
