"""The ``lethe`` command line.

Documented in API.md, "Command line", and docs/operating.md, "The command line
for scripts".

One module per command group, each owning its flags (``add``) and its
handler (``run``); :func:`main` builds the parser from them and dispatches on
the command's name:

===============  ===========================================================
module           holds
===============  ===========================================================
``_common``      exit statuses, the help format, shared flags and flag types,
                 ``--json`` output, progress bars, opening a store beside a
                 running server
``_settings``    the environment and the ``--config`` file layered over the
                 defaults
``_serve``       ``lethe serve``: the server's flags and process
``_shard``       ``lethe shard``: moved-away markers, token import, audit of
                 every shard
``_nginx``       the nginx config generator (pure) behind ``shard nginx-config``
``_owner``       ``lethe owner``: moving an owner between shards
``_token``       ``lethe token create | list | revoke``
``_backup``      ``lethe backup``
``_rotate``      ``lethe rotate`` (server stopped)
``_audit``       ``lethe audit``
``_restore``     ``lethe restore`` (server stopped)
``_demo``        ``lethe demo`` (its flags; the demo is :mod:`lethe.demo`)
``_probe``       ``lethe probe`` (its flags; the probe is :mod:`lethe.probe`)
``_mcp``         ``lethe mcp`` (its flags; the MCP server is :mod:`lethe.mcp`,
                 imported only when it runs)
``_forget``      ``lethe forget`` against a running server (the work is
                 :mod:`lethe.remote`)
``_export``      ``lethe export``: an owner's records from a running server
                 into a JSON Lines file (the work is :mod:`lethe.remote`)
``_retention``   ``lethe retention``: retention of records, threads and an
                 owner's new records on a running server
``_receipt``     ``lethe receipt public-key | verify | rotate-key``: the keys
                 that sign deletion receipts
===============  ===========================================================

May import: everything of the project (``server`` rooms through their faces,
``lethe``, ``shredder``, ``index``); the heavy rooms (the app, retrieval,
lifecycle, FAISS and the embedders) only inside a handler, so a command loads
only what it runs: ``lethe token list`` never imports FAISS (a test).

Settings: every long flag comes from the command line, else the environment
(``--kek-file`` → ``LETHE_KEK_FILE``), else a TOML config file (``--config``
or ``LETHE_CONFIG``; key ``kek_file``, top level or a command's table), else
its default, which ``--help`` shows (:mod:`server.cli._settings`).

Output: with ``--json`` a command prints one JSON document on stdout (its
schema in docs/operating.md) and nothing else there; logs, notes and progress
bars go to stderr, bars only on a terminal and never with ``--quiet``.

Exit status (:data:`EXIT_OK` …): 0 success; 1 a failed check (``audit``,
``probe``, ``demo``, ``receipt verify``), no such token to revoke, or a record
a remote command names that the server does not have (``forget``,
``export``); 2 usage, configuration or resource error, as one line on stderr
naming the flag, variable, config key, path or address (for a remote command
also: the server cannot be reached or refuses the token, the owner or the
request); 130 interrupted.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from lethe._units import parse_duration, parse_message_size, parse_size
from server.cli import (
    _audit,
    _backup,
    _demo,
    _export,
    _forget,
    _mcp,
    _owner,
    _probe,
    _receipt,
    _restore,
    _retention,
    _rotate,
    _serve,
    _shard,
    _token,
)
from server.cli._common import (
    EPILOG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    HelpFormatter,
)
from server.cli._settings import SettingsError, apply_settings

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "main",
    "parse_duration",
    "parse_message_size",
    "parse_size",
]

COMMANDS = (
    _serve,
    _shard,
    _owner,
    _token,
    _backup,
    _rotate,
    _audit,
    _restore,
    _demo,
    _probe,
    _mcp,
    _forget,
    _export,
    _retention,
    _receipt,
)
"""The command modules, in the order ``lethe --help`` lists them; each has
``add(sub)``, which registers its parser with ``run`` as its handler."""


def build_parser() -> argparse.ArgumentParser:
    """Build the ``lethe`` parser with the built-in defaults.

    :func:`server.cli._settings.apply_settings` then layers the environment
    and the config file over them.
    """
    parser = argparse.ArgumentParser(
        prog="lethe",
        description="Lethe memory store. `lethe COMMAND --help` shows a command's flags "
        "and their defaults.",
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``lethe`` console script.

    Args:
        argv: the arguments (default ``sys.argv[1:]``); settings not on it come
            from the environment, then the config file (:mod:`server.cli._settings`).

    Returns:
        The exit status: :data:`EXIT_OK`, :data:`EXIT_FAILED`,
        :data:`EXIT_USAGE` or :data:`EXIT_INTERRUPTED` (argparse itself exits
        with 2 on a malformed command line).
    """
    from server.store import StoreLockedError
    from shredder import EnvironmentConfigError, ShredderError

    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # FAISS, imported only by the commands that search, logs which CPU build it
    # loads at INFO: noise before a command's own first line.
    logging.getLogger("faiss").setLevel(logging.WARNING)
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        apply_settings(parser, words, os.environ)
    except SettingsError as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    args = parser.parse_args(words)
    args.argv = tuple(words)  # the command line as given (lethe serve --processes N reuses it)
    try:
        status: int = args.run(args)
    except KeyboardInterrupt:
        print(f"lethe {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except (EnvironmentConfigError, StoreLockedError, ShredderError, OSError) as exc:
        print(f"lethe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return status
