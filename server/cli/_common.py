"""What every ``lethe`` command shares: exit statuses, flags, ``--json`` output, progress bars.

In full: the exit statuses, the help format, the common flags, the argparse
types of flag values, ``--json`` output and progress bars.

Nothing here imports a room of the server: a command's module imports what
its handler needs, heavy rooms (the app, retrieval, FAISS) only inside the
handler, so ``lethe token list`` loads neither the gRPC server nor FAISS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from lethe.names import ID_RE
from server.cli._settings import CONFIG_ENV

Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
"""The ``lethe`` parser's sub-command registry a command module adds itself to."""

EXIT_OK = 0
"""The command did what it was asked."""
EXIT_FAILED = 1
"""A check failed (``audit``, ``probe``, ``demo``, ``receipt verify``), ``token revoke``
found no such token, or the server has no record a remote command named (``forget``)."""
EXIT_USAGE = 2
"""Usage, configuration or resource error: one line on stderr names the flag,
variable, file, path or address; for a remote command also a server that cannot
be reached or refuses the token, the owner or the request."""
EXIT_INTERRUPTED = 130
"""Interrupted (SIGINT, Ctrl-C) before the command finished; ``serve`` instead
stops gracefully on SIGINT and exits 0."""

EPILOG = (
    "Every --some-flag can also be set by the environment variable LETHE_SOME_FLAG or the "
    "key some_flag of the --config file (top level, or this command's table); the command "
    "line wins, then the environment, then the file. Exit status: 0 success; 1 a check "
    "failed (audit, probe, demo, receipt verify), no such token, or no such record to forget; "
    "2 usage, configuration or resource error, or a server that cannot be reached or refuses "
    "(one line on stderr naming it); 130 interrupted."
)
_DATA_HELP = "the data directory (LMDB data environment and keystore)"
_KEK_HELP = (
    "the KEK file (default: the one `lethe serve` created at first start, "
    "~/.config/lethe/keks/<store-id>.kek; the LETHE_KEK variable holds an in-memory KEK instead)"
)


class HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default.

    The default shown is the value in force (the environment's or the config
    file's, when one sets it), ``on``/``off`` for a switch; an option without a
    default says in its own help what happens without it. A bearer token's
    value is never shown.
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "%(default)" in text or action.default is None:
            return text + (" (required)" if action.required else "")
        if action.default is argparse.SUPPRESS:
            return text
        if action.nargs == 0:
            text = text.replace(" (default: %(default)s)", "")  # BooleanOptionalAction's own
            return f"{text} (default: {'on' if action.default else 'off'})"
        if "--token" in action.option_strings:
            return f"{text} (default: set, not shown)"
        return f"{text} (default: %(default)s)"


def command(
    sub: Subcommands,
    name: str,
    help_text: str,
    *,
    data: bool = True,
    json_help: str | None = None,
    progress: bool = False,
) -> argparse.ArgumentParser:
    """Add a sub-command with the flags most commands share.

    Args:
        sub: the registry to add it to (``lethe``'s, or a group's such as ``token``).
        name: the command's name.
        help_text: one line for ``--help``.
        data: add ``--data`` and ``--kek-file``.
        json_help: what ``--json`` prints; None: no ``--json`` flag.
        progress: add ``--quiet`` (the command shows a progress bar).

    Returns:
        The command's parser, with ``--config`` and the flags asked for.
    """
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=EPILOG,
        formatter_class=HelpFormatter,
        allow_abbrev=False,
    )
    add_config(parser)
    if data:
        parser.add_argument(
            "--data", type=Path, default="./lethe-data", metavar="DIR", help=_DATA_HELP
        )
        parser.add_argument("--kek-file", type=Path, default=None, metavar="FILE", help=_KEK_HELP)
    if json_help is not None:
        parser.add_argument(
            "--json",
            action=argparse.BooleanOptionalAction,
            default=False,
            help=f"print one JSON document on stdout: {json_help}",
        )
    if progress:
        parser.add_argument(
            "--quiet",
            action=argparse.BooleanOptionalAction,
            default=False,
            help="no progress bar on stderr (there is none anyway when stderr is not a terminal)",
        )
    return parser


def add_config(parser: argparse.ArgumentParser) -> None:
    """Add ``--config PATH`` (a TOML file of settings) to ``parser``."""
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"a TOML file of settings (default: ${CONFIG_ENV}, else none); command line > "
        "environment > config file > default",
    )


def add_remote(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Add ``--target``, ``--token`` and ``--tls-ca``: the flags of a command run against a server.

    Args:
        parser: the command's parser.
        required: whether ``--target`` and ``--token`` are required (``lethe audit``
            runs on ``--data`` without them).
    """
    parser.add_argument(
        "--target",
        type=address,
        required=required,
        default=None,
        metavar="HOST:PORT",
        help="the server's gRPC address (plaintext on a loopback address, else TLS)"
        + ("" if required else " (default: none: the command works on --data)"),
    )
    parser.add_argument(
        "--token",
        required=required,
        default=None,
        help="a bearer token allowed to act for the owners named (better from LETHE_TOKEN: "
        "a flag shows in the process list)" + ("" if required else " (default: none)"),
    )
    parser.add_argument(
        "--tls-ca",
        type=Path,
        default=None,
        metavar="FILE",
        help="PEM file of the CAs that sign the server's certificate (default: the system's)",
    )


def run_remote(args: argparse.Namespace, work: Callable[[Any], int]) -> int:
    """Run ``work`` on a client of ``args.target``, mapping its failures to exit statuses.

    Args:
        args: parsed flags of :func:`add_remote` (and ``command``, for messages).
        work: given a connected :class:`lethe.client.Client`, does the command's
            work and returns its exit status.

    Returns:
        ``work``'s status; :data:`EXIT_FAILED` when the server answers ``NOT_FOUND``
        for what was named; :data:`EXIT_USAGE` when it cannot be reached or refuses
        the token, the owner or the request (one line on stderr says which).
    """
    from lethe.client import NotFound
    from lethe.remote import RemoteError, connect

    name = " ".join(w for w in (args.command, getattr(args, "action", None)) if w)
    if not args.target or not args.token:
        print(f"lethe {name}: --target and --token (or LETHE_TOKEN) are required", file=sys.stderr)
        return EXIT_USAGE
    try:
        with connect(args.target, args.token, tls_ca=args.tls_ca) as client:
            return work(client)
    except RemoteError as exc:
        print(f"lethe {name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except NotFound as exc:
        print(f"lethe {name}: {exc.reason_name or 'NOT_FOUND'}: {exc.details()}", file=sys.stderr)
        return EXIT_FAILED


# ---------------------------------------------------------------------- flag types


def positive_int(text: str) -> int:
    """Parse a whole number ≥ 1 (argparse type).

    Raises:
        argparse.ArgumentTypeError: not digits, or 0.
    """
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def non_negative_int(text: str) -> int:
    """Parse a whole number ≥ 0 (argparse type).

    Raises:
        argparse.ArgumentTypeError: not digits.
    """
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return int(text)


def address(value: str) -> str:
    """Check ``HOST:PORT`` with PORT in 0..65535 (argparse type).

    Raises:
        argparse.ArgumentTypeError: no host, or a bad port.
    """
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with PORT in 0..65535, got {value!r}")
    return value


def owner_id(value: str) -> str:
    """Check an owner id, ``[a-z0-9][a-z0-9-]{0,62}`` (argparse type).

    Raises:
        argparse.ArgumentTypeError: it does not match.
    """
    if not ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError("owner ids match [a-z0-9][a-z0-9-]{0,62}")
    return value


# ---------------------------------------------------------------------- output


def emit(document: dict[str, Any]) -> None:
    """Print ``document`` as the one JSON document of a ``--json`` run (stdout)."""
    print(json.dumps(document, indent=2, sort_keys=True), flush=True)


def when(seconds: float) -> str:
    """Format seconds since the epoch as ``2026-12-01T13:52:01Z``; ``-`` for 0 (never)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds)) if seconds else "-"


def rfc3339(seconds: float) -> str | None:
    """Format seconds since the epoch as ``2026-12-01T13:52:01Z``; None for 0 (never)."""
    return when(seconds) if seconds else None


class Stages:
    """A tqdm bar on stderr over the named stages of one command.

    Off with ``--quiet``, and whenever stderr is not a terminal (tqdm's
    ``disable=None``), so scripts and logs get no bar.
    """

    def __init__(self, desc: str, stages: Sequence[str], quiet: bool) -> None:
        from tqdm import tqdm

        self._bar = tqdm(
            total=len(stages),
            desc=desc,
            unit="step",
            file=sys.stderr,
            disable=True if quiet else None,
            leave=False,
        )
        self._started = False

    def __call__(self, stage: str) -> None:
        """Mark the previous stage done and ``stage`` started."""
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_postfix_str(stage)

    def close(self) -> None:
        """Mark the last stage done and remove the bar."""
        if self._started:
            self._bar.update(1)
        self._bar.close()


# ---------------------------------------------------------------------- the data directory


def no_store(data: Path) -> Exception:
    """The error of a command pointed at a directory that holds no store."""
    from shredder import EnvironmentConfigError

    return EnvironmentConfigError(
        f"{data} holds no lethe store; start `lethe serve --data {data}` once "
        "first, or pass the data directory the server uses"
    )


def has_store(data: Path) -> bool:
    """Whether ``data`` holds a store's keystore (a server started there once)."""
    from server.store import data_paths
    from shredder import Keystore

    return Keystore.read_store_id(data_paths(data.resolve())[1]) is not None


def open_beside(args: argparse.Namespace) -> Any:
    """Open ``args.data``'s store beside a running server (no lock).

    The token, shard-marker and owner commands open their store this way.

    Returns:
        The :class:`server.store.Store` (the caller closes it).

    Raises:
        EnvironmentConfigError: ``args.data`` holds no store.
    """
    from server.store import Store

    if not has_store(args.data):
        raise no_store(args.data)
    return Store(args.data, kek_file=args.kek_file, lock=False)
