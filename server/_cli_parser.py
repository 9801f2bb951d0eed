"""The parser of the ``lethe`` command line: every command, flag, help text and
default, and the checks of flag values (``server.cli`` runs the commands;
``server._settings`` layers the environment and config file over these
defaults).

Defaults are given as the text a user would type (``"72h"``, ``"4GiB"``):
argparse converts them with the flag's type, and ``--help`` shows them as
written.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from lethe.probe import add_probe_arguments, parse_duration
from server._auth import LABEL_RE
from server._names import ID_RE
from server._owner_moves import add_owner_commands
from server._settings import CONFIG_ENV
from server._shards import add_serve_arguments, add_shard_commands

__all__ = ["build_parser", "parse_duration", "parse_message_size", "parse_size"]


_SIZE_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}


def parse_size(text: str) -> int:
    """``64GiB``, ``512MiB``, ``10GB`` or a number of bytes → bytes (≥ 1 MiB).

    Raises:
        argparse.ArgumentTypeError: malformed, or below 1 MiB.
    """
    m = _SIZE_RE.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 64GiB, 512MiB, 10GB)")
    size = int(float(m.group(1)) * _SIZE_UNITS[m.group(2)])
    if size < 1 << 20:
        raise argparse.ArgumentTypeError("the store's maximum size must be at least 1MiB")
    return size


def parse_message_size(text: str) -> int:
    """A gRPC message limit: ``16MiB``, ``512KiB``, ``1048576`` (at most 2 GiB - 1) → bytes.

    Raises:
        argparse.ArgumentTypeError: malformed, zero or too large for gRPC.
    """
    match = _SIZE_RE.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 16MiB, 512KiB, 65536)")
    size = int(float(match.group(1)) * _SIZE_UNITS[match.group(2)])
    if not 0 < size < 1 << 31:
        raise argparse.ArgumentTypeError("size must be positive and below 2GiB")
    return size


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}")
    return int(text)


def _non_negative_int(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}")
    return int(text)


def _label(value: str) -> str:
    if not LABEL_RE.fullmatch(value):
        raise argparse.ArgumentTypeError(
            "labels match [A-Za-z0-9][A-Za-z0-9._-]{0,63} (stored in plaintext: no content)"
        )
    return value


def _address(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with PORT in 0..65535, got {value!r}")
    return value


def _address_or_off(value: str) -> str:
    return value if value == "off" else _address(value)


def _embedder(value: str) -> str:
    """``wordllama``, ``none`` or ``onnx:DIR`` with DIR an existing directory."""
    if value in ("wordllama", "none"):
        return value
    directory = value[len("onnx:") :] if value.startswith("onnx:") else ""
    if not directory:
        raise argparse.ArgumentTypeError(f"expected wordllama, none or onnx:DIR, got {value!r}")
    if not Path(directory).is_dir():
        raise argparse.ArgumentTypeError(f"onnx:{directory}: no such directory")
    return value


def _owner(value: str) -> str:
    if not ID_RE.fullmatch(value):
        raise argparse.ArgumentTypeError("owner ids match [a-z0-9][a-z0-9-]{0,62}")
    return value


class _HelpFormatter(argparse.HelpFormatter):
    """Every option's help ends with its default: the value in force (the
    environment's or the config file's, when one sets it), ``on``/``off`` for a
    switch; an option without a default says in its own help what happens
    without it. A bearer token's value is never shown."""

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


_EPILOG = (
    "Every --some-flag can also be set by the environment variable LETHE_SOME_FLAG or the "
    "key some_flag of the --config file (top level, or this command's table); the command "
    "line wins, then the environment, then the file. Exit status: 0 success; 1 a check "
    "failed (audit, probe, demo) or no such token; 2 usage, configuration or resource error "
    "(one line on stderr naming it); 130 interrupted."
)
_DATA_HELP = "the data directory (LMDB data environment and keystore)"
_KEK_HELP = (
    "the KEK file (default: the one `lethe serve` created at first start, "
    "~/.config/lethe/keks/<store-id>.kek; the LETHE_KEK variable holds an in-memory KEK instead)"
)


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    help_text: str,
    *,
    data: bool = True,
    json_help: str | None = None,
    progress: bool = False,
) -> argparse.ArgumentParser:
    """A sub-command with the flags most commands share: ``--config``,
    ``--data``, ``--kek-file``, ``--json`` (when ``json_help`` says what it
    prints) and ``--quiet`` (when it shows progress)."""
    parser = sub.add_parser(
        name,
        help=help_text,
        description=help_text,
        epilog=_EPILOG,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    _add_config(parser)
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


def _add_config(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"a TOML file of settings (default: ${CONFIG_ENV}, else none); command line > "
        "environment > config file > default",
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``lethe`` parser, with the built-in defaults (before
    :func:`server._settings.apply_settings` layers the environment and the
    config file over them)."""
    parser = argparse.ArgumentParser(
        prog="lethe",
        description="Lethe memory store. `lethe COMMAND --help` shows a command's flags "
        "and their defaults.",
        epilog=_EPILOG,
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = _command(
        sub,
        "serve",
        "serve the gRPC API",
        json_help="where it serves, once listening ({listen, port, metrics_listen, data, kek})",
    )
    serve.add_argument(
        "--listen", type=_address, default="127.0.0.1:50051", help="HOST:PORT for gRPC"
    )
    serve.add_argument(
        "--metrics-listen",
        type=_address_or_off,
        default="127.0.0.1:9464",
        help="HOST:PORT for /metrics, or 'off'",
    )
    serve.add_argument(
        "--embedder",
        type=_embedder,
        default="wordllama",
        help="wordllama (in its wheel), none (clients send vectors; otherwise lexical search "
        "only) or onnx:DIR (a sentence encoder's model.onnx and tokenizer.json in DIR; the "
        "onnx extra). A change re-embeds each owner's vectors on its first use",
    )
    serve.add_argument(
        "--pending-ttl",
        type=parse_duration,
        default="72h",
        help="a PENDING turn or memory expires this long after it was written",
    )
    serve.add_argument(
        "--sweep-interval",
        type=parse_duration,
        default="5s",
        help="run the sweeper (expiry, audits, rotation when due) this often",
    )
    serve.add_argument(
        "--rotation-interval",
        type=parse_duration,
        default="1h",
        help="complete shreds cryptographically this often",
    )
    serve.add_argument(
        "--index-cache-size",
        type=parse_size,
        default="4GiB",
        help="bytes of in-memory search indexes kept (estimated); past it the least recently "
        "searched owners' indexes are dropped and rebuilt from the store on their next search",
    )
    serve.add_argument(
        "--max-store-size",
        type=parse_size,
        default="64GiB",
        help="the data environment grows on demand up to this size; a write that does not "
        "fit is refused whole with STORE_FULL (units B, KiB, MiB, GiB, TiB)",
    )
    serve.add_argument(
        "--tagger",
        choices=["rules", "none"],
        default="rules",
        help="propose candidate memories for untagged turns",
    )
    bounds = serve.add_argument_group(
        "concurrency", "past a bound a call is refused at once with RESOURCE_EXHAUSTED"
    )
    bounds.add_argument(
        "--workers", type=_positive_int, default=16, help="threads for blocking work"
    )
    bounds.add_argument(
        "--max-inflight", type=_positive_int, default=64, help="unary calls at once, in all"
    )
    bounds.add_argument(
        "--max-inflight-per-principal",
        type=_positive_int,
        default=16,
        help="unary calls at once per token",
    )
    bounds.add_argument(
        "--max-running-per-principal",
        type=_positive_int,
        default=4,
        help="of those, calls of one token running at once",
    )
    bounds.add_argument(
        "--max-streams", type=_positive_int, default=1024, help="open Watch streams, in all"
    )
    bounds.add_argument(
        "--max-streams-per-principal",
        type=_positive_int,
        default=128,
        help="open Watch streams per token",
    )
    transport = serve.add_argument_group("transport")
    transport.add_argument(
        "--tls-cert", type=Path, default=None, help="PEM certificate chain (default: plaintext)"
    )
    transport.add_argument(
        "--tls-key", type=Path, default=None, help="PEM private key (default: plaintext)"
    )
    transport.add_argument(
        "--client-ca",
        type=Path,
        default=None,
        help="PEM CAs of client certificates: clients must present one (mutual TLS; "
        "default: no client certificates asked)",
    )
    transport.add_argument(
        "--max-receive-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest request message accepted",
    )
    transport.add_argument(
        "--max-send-message-size",
        type=parse_message_size,
        default="16MiB",
        help="largest response message sent",
    )
    transport.add_argument(
        "--keepalive-min-interval",
        type=parse_duration,
        default="10s",
        help="accept client keepalive pings this far apart or more",
    )
    transport.add_argument(
        "--keepalive-time",
        type=parse_duration,
        default="60s",
        help="ping an idle connection this often",
    )
    transport.add_argument(
        "--keepalive-timeout",
        type=parse_duration,
        default="20s",
        help="drop a connection whose ping is unanswered this long",
    )
    transport.add_argument(
        "--drain-grace",
        type=parse_duration,
        default="30s",
        help="on SIGTERM, time given to calls in flight",
    )
    add_serve_arguments(serve)
    add_shard_commands(sub, message_size=parse_message_size, address=_address, owner=_owner)
    add_owner_commands(sub, owner=_owner, address=_address)

    token = sub.add_parser(
        "token",
        help="create, list and revoke bearer tokens",
        formatter_class=_HelpFormatter,
        allow_abbrev=False,
    )
    token_sub = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = _command(
        token_sub,
        "create",
        "print a new bearer token",
        json_help="{token, id, owners, admin, label, expire_time}",
    )
    who = create.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--owner",
        type=_owner,
        action="append",
        dest="owners",
        help="an owner id it may act for (repeat for more; command line only)",
    )
    who.add_argument(
        "--admin", action="store_true", help="acts for every owner (command line only)"
    )
    create.add_argument(
        "--label",
        type=_label,
        default=None,
        help="a name for it, stored in plaintext: no content (default: none)",
    )
    create.add_argument(
        "--expires-in",
        type=parse_duration,
        default=None,
        help="refuse it after this, e.g. 30d (default: never expires)",
    )
    _command(
        token_sub,
        "list",
        "list tokens (ids, never secrets)",
        json_help="{tokens: [{id, state, create_time, expire_time, label, admin, owners}]}",
    )
    revoke = _command(
        token_sub,
        "revoke",
        "revoke a token by id (takes effect within 1 s)",
        json_help="{id, revoke_time}",
    )
    revoke.add_argument("id", help="the token's id, as `lethe token list` shows it")

    backup = _command(
        sub,
        "backup",
        "consistent compacted copy of the data environment (safe while serving)",
        json_help="{out, bytes, sha256, store_id, create_time}",
        progress=True,
    )
    backup.add_argument(
        "--out", type=Path, required=True, help="a new or empty directory outside --data"
    )

    _command(
        sub,
        "rotate",
        "complete pending shreds now: new ring and KEK keys (server stopped)",
        json_help="{rings_renewed, ring_keys_rewrapped, kek_versions_destroyed}",
        progress=True,
    )

    _command(
        sub,
        "audit",
        "print the audit counts of every owner; exit 1 if any count is non-zero",
        json_help="{healthy, totals, owners: {owner: counts}} (unhealthy owners only)",
    )

    restore = _command(
        sub,
        "restore",
        "restore a data backup beside the keystore (server stopped)",
        json_help="{backup, data, forgotten, deletions_resumed, kept_without_key}",
        progress=True,
    )
    restore.add_argument(
        "--backup", type=Path, required=True, help="a directory `lethe backup` wrote"
    )

    demo = _command(
        sub,
        "demo",
        "ingest LoCoMo, measure recall, forget, back up, restore",
        json_help="the report --out gets (stage lines then go to stderr)",
        progress=True,
    )
    source = demo.add_mutually_exclusive_group()
    source.add_argument(
        "--locomo",
        type=Path,
        default=None,
        help="path of locomo10.json; one that does not exist fails with exit status 2 "
        "(default: ../shared/data/locomo/locomo10.json if it exists, else the sample)",
    )
    source.add_argument(
        "--sample",
        action="store_true",
        help="run on the short sample conversation instead of LoCoMo (command line only)",
    )
    demo.add_argument(
        "--out", type=Path, default="demo-results.json", help="the JSON file the figures go to"
    )
    demo.add_argument(
        "--conversations",
        type=_non_negative_int,
        default=0,
        help="use only the first N conversations (0 = all)",
    )

    probe = _command(
        sub,
        "probe",
        "plant-and-delete probe against a running server",
        data=False,
        json_help="{passed, cycles, stages: [{cycle, stage, status, detail}], seconds}",
    )
    add_probe_arguments(probe)
    return parser
